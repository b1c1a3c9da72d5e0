#!/usr/bin/env bash
# The main job behind `make run`, on the default device (CUDA when present, else the CPU): the
# memory/time frontier of every planner where activations dominate, for the seed experiments'
# two models, ResNet-152 (224x224, batch 8) and the Transformer (d_model 512, 6 layers, 8 heads,
# ff 2048, vocab 30000, seq 128; batch 32). Each model is profiled once; blocks, sqrt, mutwo and
# dp are planned at 24 budgets from the lower bound to the no-remat peak (predictions are cheap);
# each policy's lowest plan is trained to confirm it (measured peaks = predicted, to the byte).
# Budgets bound reserved bytes: the steps run under the allocator's limit at the budget. Then the
# seed-format summary tables for ResNet-152 at batches 4 and 8 with dp at 50%. Prints the
# frontier tables; writes frontier.csv/png, profiles, tables, CSV files and plots. About 5
# minutes on 2 CPU cores (5 min 48 s measured on 2026-11-23, a machine on which a ResNet-152
# batch-8 step takes 4 s).
set -euo pipefail
build="${1:-build}"
out="${REGEN_OUT:-out/main-job}"
mkdir -p "$out/resnet152" "$out/transformer"
regen="$build/regen"

echo "== 1/3 ResNet-152, 224x224, batch 8: profile, plan every policy at 24 budgets, train the lowest"
"$regen" frontier --model resnet152 --image-size 224 --batch 8 --points 24 --execute 1 \
  --steps 2 --out "$out/resnet152" --plot

echo
echo "== 2/3 Transformer, batch 32: the same"
"$regen" frontier --model transformer --batch 32 --points 24 --execute 1 --steps 2 \
  --out "$out/transformer" --plot

echo
echo "== 3/3 ResNet-152 (224x224): batches 4 and 8 without remat and with dp at 50%"
echo "       (the seed summary tables, decisions CSVs, peak memory and latency vs batch size)"
"$regen" sweep --model resnet152 --image-size 224 --batches 4,8 --policies dp --budgets 50% \
  --steps 2 --out "$out" --plot

echo
# Every output exists and parses, and every executed plan measured its predicted peaks exactly.
python3 "$(dirname "$0")/check-main-job.py" "$out"

echo
echo "main job done: frontier.csv and frontier.png per model in $out/resnet152 and $out/transformer"
echo "(with the profiles), and the summary tables, CSV files, decisions and plots in $out/"
ls "$out" "$out/resnet152" "$out/transformer"
