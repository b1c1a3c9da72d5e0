#!/usr/bin/env bash
# The main job behind `make run`: profile, plan and train with rematerialization on the default
# device (CUDA when present, else the CPU), for the seed experiments' two models, ResNet-152 (on
# 128x128 images on a CPU, to finish in minutes) and the Transformer (d_model 512, 6 layers,
# 8 heads, ff 2048, vocab 30000, seq 128). Prints the seed-format summary tables and where the
# CSV files and plots went. About 4 minutes on 2 CPU cores (3 min 44 s measured on 2026-11-22).
set -euo pipefail
build="${1:-build}"
out="${REGEN_OUT:-out/main-job}"
mkdir -p "$out"
regen="$build/regen"

echo "== 1/3 ResNet-152 on 128x128 images, batch 8: profile one training iteration"
"$regen" profile --model resnet152 --image-size 128 --batch 8 --warmup 2 --iterations 3 --out "$out"

echo
echo "== 2/3 ResNet-152 (128x128): batches 4 and 8, without remat and with blocks, sqrt and mutwo"
echo "       at 80% of the no-remat peak and at each policy's lowest feasible peak"
"$regen" sweep --model resnet152 --image-size 128 --batches 4,8 --policies blocks,sqrt,mutwo \
  --budgets 80%,lowest --steps 4 --out "$out" --plot

echo
echo "== 3/3 Transformer: batches 8 and 16, the same policies and budgets"
"$regen" sweep --model transformer --batches 8,16 --policies blocks,sqrt,mutwo \
  --budgets 80%,lowest --steps 4 --out "$out" --plot

echo
echo "main job done: profile (profile.txt, trace.json), summary tables, CSV files, decisions and"
echo "plots are in $out/"
ls "$out"
