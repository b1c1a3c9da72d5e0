#!/usr/bin/env bash
# The GPU work of issues 6 and 7 in a few long calls, for a session lent a GPU machine (the device
# tool runs commands in a copy of this tree; what lands in $OUT comes back, at most 8 files, so
# each phase packs its results into one tarball). Phases, each well inside a 10-minute call on a
# 16-core H100 machine:
#   build     configure (REGEN_CUDA=ON) and build Release in build-gpu
#   test      every test (CPU and GPU suites), then test_cuda_ops and test_cuda_remat under
#             compute-sanitizer memcheck
#   kernels   regen bench kernels (native vs cuDNN convolution, attention, layernorm, GEMM)
#   resnet    regen sweep on cuda: ResNet-152 at batches 16,32,64,128 (none, blocks, sqrt, mutwo
#             at 70%, 50%, lowest), then PyTorch's eager and per-block checkpoint baselines
#   transformer   the same for the Transformer at batches 32,64,128,256
#   fit       the largest batch that fits 16 GiB for none, blocks and mutwo (both models)
# Usage: bash scripts/gpu-session.sh PHASE [PHASE...]   (OUT defaults to out/gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-out/gpu}"
mkdir -p "$out"
build=build-gpu
regen="$build/regen"
work="$out/work"
mkdir -p "$work"
jobs="$(nproc)"

log() { echo "[gpu-session $(date -u +%H:%M:%S)] $*"; }

pack() {  # pack NAME: everything in $work into $out/NAME.tar.gz, then empty $work
  tar -czf "$out/$1.tar.gz" -C "$work" . && rm -rf "${work:?}"/* && log "packed $out/$1.tar.gz"
}

phase_build() {
  log "nvidia-smi"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DREGEN_CUDA=ON -DREGEN_CUDA_ARCHS=90 \
    > "$work/configure.txt" 2>&1 || { cat "$work/configure.txt"; return 1; }
  cmake --build "$build" -j "$jobs" > "$work/build.txt" 2>&1 || { tail -50 "$work/build.txt"; return 1; }
  log "built"
}

phase_test() {
  (cd "$build" && ctest --output-on-failure -j 4) > "$work/ctest.txt" 2>&1
  tail -25 "$work/ctest.txt"
  for t in test_cuda_ops test_cuda_remat test_cuda_allocator test_cuda_autograd; do
    "$build/tests/$t" -s > "$work/$t.txt" 2>&1; log "$t exit $?"
  done
  if command -v compute-sanitizer > /dev/null; then
    for t in test_cuda_ops test_cuda_remat; do
      compute-sanitizer --tool memcheck --leak-check full "$build/tests/$t" \
        > "$work/memcheck_$t.txt" 2>&1
      log "memcheck $t exit $?: $(grep -E 'ERROR SUMMARY' "$work/memcheck_$t.txt" | tail -1)"
    done
  else
    log "compute-sanitizer not found"
  fi
  pack test
}

phase_kernels() {
  "$regen" bench kernels > "$work/bench_kernels.txt" 2>&1; log "bench kernels exit $?"
  tail -60 "$work/bench_kernels.txt"
  pack kernels
}

sweep() {  # sweep MODEL BATCHES
  "$regen" sweep --device cuda --model "$1" --batches "$2" --policies blocks,sqrt,mutwo \
    --budgets 70%,50%,lowest --steps 6 --out "$work/sweep_$1" --plot > "$work/sweep_$1.txt" 2>&1
  log "regen sweep $1 exit $?"; grep -E "^   |no remat" "$work/sweep_$1.txt"
}

torch_baseline() {  # torch_baseline MODEL BATCHES
  python3 tools/torch_baseline.py --device cuda --model "$1" --batches "$2" \
    --modes eager,checkpoint,compile --math fp32 --csv "$work/torch_$1.csv" \
    > "$work/torch_$1.txt" 2>&1
  log "torch_baseline $1 exit $?"; tail -20 "$work/torch_$1.txt"
}

phase_resnet() {
  sweep resnet152 16,32,64,128
  torch_baseline resnet152 16,32,64,128
  pack resnet
}

phase_transformer() {
  sweep transformer 32,64,128,256
  torch_baseline transformer 32,64,128,256
  pack transformer
}

phase_fit() {  # the largest batch whose plan fits 16 GiB, by doubling then bisection on plans
  for model in resnet152 transformer; do
    for policy in none blocks mutwo; do
      lo=0; hi=8
      fits() {
        "$regen" profile --device cuda --model "$model" --batch "$1" --warmup 1 --iterations 1 \
          --out "$work/fit_tmp" > /dev/null 2>&1 || return 1
        "$regen" plan --profile "$work/fit_tmp/profile.json" --policy "$policy" --budget 16GiB \
          --out "$work/fit_tmp/plan.json" --decisions "$work/fit_tmp/d.csv" \
          | grep -q "cannot be met" && return 1
        return 0
      }
      mkdir -p "$work/fit_tmp"
      while fits "$hi"; do lo=$hi; hi=$((hi * 2)); [ "$hi" -gt 4096 ] && break; done
      while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2)); if fits "$mid"; then lo=$mid; else hi=$mid; fi
      done
      echo "$model,$policy,16GiB,$lo" | tee -a "$work/fit.csv"
    done
  done
  rm -rf "$work/fit_tmp"
  pack fit
}

[ $# -gt 0 ] || { sed -n 2,16p "$0"; exit 2; }
status=0
for p in "$@"; do
  log "phase $p"
  "phase_$p" || { log "phase $p failed"; status=1; }
done
exit $status
