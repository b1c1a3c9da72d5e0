#!/usr/bin/env bash
# The main job behind `make run`: profile, plan and train with rematerialization on the default
# device (CUDA when present, else the CPU), for a ResNet on small images and for the seed
# experiments' Transformer, at sizes that finish in a few minutes on 2 CPU cores. Prints the
# seed-format summary tables and where the CSV files and plots went.
set -euo pipefail
build="${1:-build}"
out="${REGEN_OUT:-out/main-job}"
mkdir -p "$out"
regen="$build/regen"

echo "== 1/3 ResNet-50 on 64x64 images: profile one iteration"
"$regen" profile --model resnet50 --image-size 64 --batch 8 --warmup 1 --iterations 2 --out "$out"

echo
echo "== 2/3 ResNet-50 (64x64): batches 8 and 16, without remat and with blocks, sqrt and mutwo at 50%"
"$regen" sweep --model resnet50 --image-size 64 --batches 8,16 --policies blocks,sqrt,mutwo \
  --budgets 50% --steps 3 --out "$out" --plot

echo
echo "== 3/3 Transformer (d_model 512, 6 layers, 8 heads, ff 2048, vocab 30000, seq 128): batch 4 and 8, mutwo at 50%"
"$regen" sweep --model transformer --batches 4,8 --policies mutwo --budgets 50% --steps 3 \
  --out "$out" --plot

echo
echo "main job done: tables, CSV files, decisions and plots are in $out/"
ls "$out"
