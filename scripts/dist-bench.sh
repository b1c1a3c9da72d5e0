#!/usr/bin/env bash
# The data-parallel figures of docs/results.md ("Data parallelism"), on the CPU: each model at 1
# rank (one process, no mpirun) and at 2 ranks under mpirun in each shard mode, one thread per
# rank, then PyTorch over gloo on the same models, batches and threads: 1 rank, and 2 ranks in
# the same shard modes (DDP, DDP with ZeroRedundancyOptimizer, FSDP2 without and with resharding
# after forward; tools/torch_ddp_baseline.py, from the virtual environment TORCH_PYTHON names;
# skipped when it is not set). Logs go to OUT (default out/dist-bench); the tables in results.md
# are read off them.
# Usage: TORCH_PYTHON=VENV/bin/python bash scripts/dist-bench.sh [build]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${OUT:-out/dist-bench}
STEPS=${STEPS:-8}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --oversubscribe --bind-to none -np 2)
# name | regen flags | torch_ddp_baseline.py flags
configs=(
  "resnet50-128|--model resnet50 --image-size 128 --batch 8|--model resnet50 --image-size 128 --batch 8"
  "transformer|--model transformer --batch 8|--model transformer --seq-len 128 --batch 8"
)
for c in "${configs[@]}"; do
  IFS='|' read -r name flags tflags <<< "$c"
  # shellcheck disable=SC2086
  {
    echo "== $name: 1 rank"
    "$BUILD/regen" train $flags --threads 1 --steps "$STEPS" --progress none
    for shard in none optimizer gradients parameters; do
      echo "== $name: 2 ranks, --shard $shard"
      "${mpi[@]}" "$BUILD/regen" train $flags --threads 1 --steps "$STEPS" --progress none \
        --shard "$shard"
    done
    if [ -n "${TORCH_PYTHON:-}" ]; then
      echo "== $name: PyTorch over gloo, 1 rank"
      "$TORCH_PYTHON" tools/torch_ddp_baseline.py --ranks 1 --threads 1 $tflags \
        --warmup 2 --steps "$((STEPS - 2))" --csv "$OUT/ddp.csv"
      for shard in none optimizer gradients parameters; do
        echo "== $name: PyTorch over gloo, 2 ranks, --shard $shard"
        "$TORCH_PYTHON" tools/torch_ddp_baseline.py --ranks 2 --threads 1 $tflags \
          --shard "$shard" --warmup 2 --steps "$((STEPS - 2))" --csv "$OUT/ddp.csv"
      done
    fi
  } 2>&1 | tee "$OUT/$name.log"
done
echo "dist-bench: logs in $OUT"
