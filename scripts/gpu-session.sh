#!/usr/bin/env bash
# The GPU programme, in phases, for a session lent a GPU machine through the device tool (README,
# "On a GPU machine"). That machine starts bare, has no package registry, and keeps nothing between
# sessions; what a command writes under $OUT comes back (at most 8 files), so each phase packs its
# results into one tarball, also when it fails or runs out of time.
#
# Before the first call, here: `bash scripts/gpu-prebuild.sh` (about 3 minutes from a built
# build-gpu: the regen tool and the CUDA suites, stripped and packed into the git-ignored
# build-pack/, 12.5 MiB), then call the device tool with carry ["build-pack"] and
# GPU_SESSION_BUILD=build-carry. A session's 15 minutes of device time held two calls on
# 2026-11-27 (a start costs about 30 s; each call ends inside the 10-minute limit, every long
# command with a share of GPU_SESSION_S):
#   1. GPU_SESSION_S=450 ... prebuilt probe test peaks kernels            (2.5 minutes)
#   2. GPU_SESSION_S=540 ... prebuilt test timing offload steps sanitize  (9 minutes; fixes rerun)
# and then, in a later session: resnet transformer torch fit batches.
# Building on the device instead (`bash scripts/gpu-deps.sh` here, carry [".gpu-deps"], phase
# build) costs minutes of device time; a warm machine keeps build-gpu between calls.
#
# Every phase runs with REGEN_REQUIRE_GPU=1: a GPU suite that finds no GPU, or a CUDA runtime that
# fails, is a failure here, never a skip.
#
# Phases:
#   prebuilt     use the programs scripts/gpu-prebuild.sh built on a machine without a GPU and the
#                call carried (GPU_SESSION_BUILD=build-carry): link the checkout path compiled into
#                them to this one, find cuBLAS/cuDNN/cudart, check that every library resolves;
#                when one does not, build here instead (the build phase, in build-gpu)
#   probe        what the machine has: GPU, driver, kernel (Firecracker or gVisor: compute-sanitizer
#                works only on Firecracker), nvcc, cmake, compilers, cuBLAS/cuDNN, PyTorch
#   build        configure (REGEN_CUDA=ON, sm_90) and build Release in build-gpu
#   test         every CUDA suite (every tests/cuda/test_*.cpp: test_cuda_dry_run checks the CUDA
#                dry run against real calls and a real step) with full output and REGEN_CUDA_SYNC=1
#                (a kernel fault is named after its launcher), then every test through ctest (CUDA
#                suites included); with a carried build, which has only the CUDA suites, each
#                suite once more without sync
#   sanitize     compute-sanitizer: memcheck with REGEN_ALLOC_DIRECT=1 (every block its own
#                cudaMalloc of its exact size, so an overrun of a tensor is seen, not hidden inside a
#                cached segment) over the op, op-table, autograd and remat suites; racecheck and
#                synccheck over the kernels with shared memory and barriers, and all three over
#                the tensor-core suites (test_cuda_conv_tc, test_cuda_attention_tc). No leak check: the
#                process-wide allocators and the library handles are kept on purpose
#   peaks        the first figures, when a call has room for little else: regen sweep on ResNet-152
#                and the Transformer at batch 32 (no remat, dp at 50% and lowest: predicted against
#                measured peaks), regen bench train at batch 32 and PyTorch eager beside it (TF32)
#   steps        regen bench train beside PyTorch eager at batch 32, TF32 and FP32, both models; and
#                ResNet-152 with cuDNN's convolution (--conv cudnn)
#   bf16         mixed precision on the device: regen bench train --precision bf16 beside PyTorch
#                eager under autocast bf16 (TF32 elsewhere), both models at batch 32, and ResNet-152
#                with cuDNN's bf16 convolution; regen sweep in bf16 (no remat, dp at 50%: predicted
#                against measured peaks) for both models
#   batches      dp at 50% at more batch sizes (ResNet-152 16 and 64, Transformer 64 and 128)
#   kernels      regen bench kernels (native vs cuDNN convolution, attention, layernorm, GEMM), in
#                TF32 (the benchmark default) and in strict FP32
#   resnet       regen sweep on cuda in TF32, ResNet-152 at batches 16,32,64,128 (one sweep per
#                batch, the smallest first): no remat, and blocks, sqrt, mutwo, dp at 70%, 50%,
#                lowest
#   transformer  the same for the Transformer at batches 32,64,128,256
#   torch        tools/torch_baseline.py for both models and the same batches (eager, per-block
#                checkpoint, torch.compile with activation_memory_budget 0.5), in TF32 like the
#                sweeps
#   fit          the largest batch whose plan fits 16 GiB for none, blocks and mutwo (both models),
#                each then trained for 3 steps to measure its peak
#   timing       the time model: ResNet-152 and the Transformer at batch 32 swept with mutwo and dp at
#                70%, 50% and lowest from a profile taken with --op-timing device (CUDA events, no
#                waits at op boundaries) and, beside it, with the default sync timing: each run's
#                predicted overhead over its profiled step against the measured one over the
#                trained no-remat step (the second run found sync's profiled step 15% slower than
#                training's and its predicted overheads about half the measured), and each plan's
#                regeneration programs' time on the device's clock against their predicted time
#   offload      the offload fate on the device: regen bench copy (pinned host memory, copy streams:
#                the measured transfer model), test_cuda_offload (exact peaks of the device and its
#                host tier, bitwise training), then ResNet-152 at batch 32 (TF32) profiled once and
#                dp with every fate at 33% and 25% of the reserved no-remat peak and at its lowest,
#                each trained 4 steps: measured peaks (device and host tier) against the predicted,
#                and the time the compute stream waited for copies (events) against the predicted
#                wait. GPU_SESSION_DEVICE=cpu GPU_OFFLOAD_MODEL=resnet50 GPU_OFFLOAD_SIZE=64 runs the
#                same commands on the CPU (a dry run of the phase without a GPU)
# Usage: bash scripts/gpu-session.sh PHASE [PHASE...]
# Environment: OUT (default out/gpu), GPU_SESSION_S (seconds for the whole call, default 570),
# GPU_SESSION_BUILD (build folder, default build-gpu), GPU_RESNET_BATCHES and
# GPU_TRANSFORMER_BATCHES (the sweeps' batches, default as above), GPU_SANITIZE_RUNS (the sanitize phase's
# runs, default all: memcheck_ops memcheck_op_table memcheck_autograd racecheck_ops synccheck_ops
# memcheck_remat racecheck_conv memcheck_tc racecheck_tc synccheck_tc).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-out/gpu}"
build="${GPU_SESSION_BUILD:-build-gpu}"  # another build folder, for a dry run of the script here
regen="$build/regen"
work="$out/work"
mkdir -p "$work"
jobs="$(nproc)"
deadline=$((SECONDS + ${GPU_SESSION_S:-570}))
export REGEN_REQUIRE_GPU=1

log() { echo "[gpu-session $(date -u +%H:%M:%S) +${SECONDS}s] $*"; }

# limited SHARE CMD...: runs CMD with at most SHARE seconds, and never past the call's deadline
# (less 20 s to pack). Exit 124 means it was stopped.
limited() {
  local share=$1; shift
  local left=$((deadline - SECONDS - 20))
  [ "$left" -lt "$share" ] && share=$left
  if [ "$share" -le 5 ]; then log "no time left for: $*"; return 124; fi
  timeout --kill-after=10 "$share" "$@"
}

pack() {  # pack NAME: everything in $work into $out/NAME.tar.gz, then empty $work
  if [ -n "$(ls -A "$work")" ]; then
    tar -czf "$out/$1.tar.gz" -C "$work" . && rm -rf "${work:?}"/* && log "packed $out/$1.tar.gz"
  fi
}

# cuDNN: the toolkit's, else the nvidia-cudnn wheel that PyTorch brings (lib/ has libcudnn.so.9).
cudnn_root=""
if [ ! -f /usr/local/cuda/include/cudnn.h ]; then
  cudnn_root=$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__))' \
               2> /dev/null || true)
  [ -n "$cudnn_root" ] && export LD_LIBRARY_PATH="$cudnn_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# Plots (regen sweep --plot): regen prefers Debian's /usr/bin/python3, which on the device image
# has no matplotlib; the python3 first on PATH there has it.
if [ -z "${REGEN_PYTHON:-}" ] && ! /usr/bin/python3 -c 'import matplotlib' 2> /dev/null &&
   python3 -c 'import matplotlib' 2> /dev/null; then
  REGEN_PYTHON=$(command -v python3); export REGEN_PYTHON
fi

sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
            /usr/local/cuda/compute-sanitizer/compute-sanitizer 2> /dev/null | head -1)

phase_prebuilt() {
  if [ ! -f "$build/SOURCE_DIR" ] && [ -f build-pack/build-carry.tar.xz ]; then
    mkdir -p "$build" && tar -xJf build-pack/build-carry.tar.xz -C "$build" --strip-components=1 &&
      log "unpacked build-pack/build-carry.tar.xz into $build"
  fi
  [ -f "$build/SOURCE_DIR" ] || { log "$build has no SOURCE_DIR: not made by scripts/gpu-prebuild.sh"; return 1; }
  local src missing d
  src=$(cat "$build/SOURCE_DIR")
  log "carried build of $(tr '\n' ' ' < "$build/COMMIT")from $src"
  if [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then
    mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src" && log "linked $src -> $PWD"
  fi
  # The libraries the programs were linked with, wherever this machine keeps them (the toolkit's
  # folder or the wheels PyTorch brings).
  # Only for a library the loader does not find by itself: PyTorch brings its own cuDNN, newer than
  # the toolkit's, and refuses an older one first on the path.
  local lib names=()
  for lib in $(ldd "$regen" "$build"/tests/test_cuda_* | awk '/not found/ {print $1}' | sort -u); do
    names+=(-o -name "$lib")
  done
  if [ ${#names[@]} -gt 0 ]; then
    for d in $(find /usr/local/cuda/ /usr/local/cuda/lib64/ /usr/lib/x86_64-linux-gnu/ /opt/ /usr/local/lib/ \
                 \( "${names[@]:1}" \) 2> /dev/null | xargs -r -n1 dirname | sort -u); do
      case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *) export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
    done
  fi
  log "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  missing=$(ldd "$regen" "$build"/tests/test_cuda_* | grep "not found" | sort -u)
  if [ -z "$missing" ] && "$regen" --help > /dev/null 2>&1; then
    ldd "$regen" | grep -E "cublas|cudnn|cudart"
    return 0
  fi
  log "the carried programs do not run here (${missing:-regen --help failed}): building instead"
  build=build-gpu; regen="$build/regen"
  phase_build
}

# peaks: the first figures, for a call with room for little else (see the header).
phase_peaks() {
  local model
  for model in resnet152 transformer; do
    limited 150 "$regen" sweep --device cuda --math tf32 --model "$model" --batches 32 \
      --policies dp --budgets 50%,lowest --steps 3 --out "$work/sweep_${model}_b32" \
      > "$work/sweep_${model}_b32.txt" 2>&1
    log "regen sweep $model batch 32 exit $?"
    grep -E "^   |no remat|error" "$work/sweep_${model}_b32.txt"
    limited 60 "$regen" bench train --device cuda --math tf32 --model "$model" --batch 32 --warmup 3 \
      --steps 10 --json "$work/bench_train_${model}_b32.json" > "$work/bench_train_${model}_b32.txt" 2>&1
    log "regen bench train $model batch 32 exit $?"; grep -vE "^ *python|^$" "$work/bench_train_${model}_b32.txt" | tail -4
    PYTHONUNBUFFERED=1 limited 90 env -u LD_LIBRARY_PATH python3 tools/torch_baseline.py --device cuda --model "$model" \
      --batches 32 --modes eager --math tf32 --warmup 3 --steps 10 --csv "$work/torch_eager_${model}_b32.csv" \
      > "$work/torch_eager_${model}_b32.txt" 2>&1
    log "torch_baseline $model eager b32 exit $?"; cat "$work/torch_eager_${model}_b32.csv" 2> /dev/null
  done
}

# steps: regen's training step beside PyTorch eager at batch 32 in both math modes, and with
# cuDNN's convolution in place of regen's own (ResNet-152).
phase_steps() {
  local model math
  for math in tf32 fp32; do
    for model in resnet152 transformer; do
      limited 60 "$regen" bench train --device cuda --math "$math" --model "$model" --batch 32 --warmup 3 \
        --steps 10 --json "$work/bench_train_${model}_b32_$math.json" > "$work/bench_train_${model}_b32_$math.txt" 2>&1
      log "regen bench train $model b32 $math exit $?"; grep -E "step time|peak" "$work/bench_train_${model}_b32_$math.txt"
      PYTHONUNBUFFERED=1 limited 90 env -u LD_LIBRARY_PATH python3 tools/torch_baseline.py --device cuda \
        --model "$model" --batches 32 --modes eager --math "$math" --warmup 3 --steps 10 \
        --csv "$work/torch_eager_${model}_b32_$math.csv" > "$work/torch_eager_${model}_b32_$math.txt" 2>&1
      log "torch_baseline $model eager b32 $math exit $?"; tail -1 "$work/torch_eager_${model}_b32_$math.csv"
    done
    limited 60 "$regen" bench train --device cuda --math "$math" --model resnet152 --batch 32 --conv cudnn \
      --warmup 3 --steps 10 --json "$work/bench_train_resnet152_b32_${math}_cudnn.json" \
      > "$work/bench_train_resnet152_b32_${math}_cudnn.txt" 2>&1
    log "regen bench train resnet152 b32 $math --conv cudnn exit $?"
    grep -E "step time|peak" "$work/bench_train_resnet152_b32_${math}_cudnn.txt"
  done
}

# bf16: the mixed-precision step against PyTorch's autocast, and its predicted peaks on the device.
phase_bf16() {
  local model status=0
  for model in transformer resnet152; do
    limited 60 "$regen" bench train --device cuda --precision bf16 --model "$model" --batch 32 \
      --warmup 3 --steps 10 --json "$work/bench_train_${model}_b32_bf16.json" \
      > "$work/bench_train_${model}_b32_bf16.txt" 2>&1
    log "regen bench train $model b32 bf16 exit $?"; grep -E "step time|peak" "$work/bench_train_${model}_b32_bf16.txt"
    PYTHONUNBUFFERED=1 limited 90 env -u LD_LIBRARY_PATH python3 tools/torch_baseline.py --device cuda \
      --model "$model" --batches 32 --modes eager --math tf32 --autocast bf16 --warmup 3 --steps 10 \
      --csv "$work/torch_eager_${model}_b32_bf16.csv" > "$work/torch_eager_${model}_b32_bf16.txt" 2>&1
    log "torch_baseline $model eager b32 autocast bf16 exit $?"; tail -1 "$work/torch_eager_${model}_b32_bf16.csv"
  done
  limited 60 "$regen" bench train --device cuda --precision bf16 --model resnet152 --batch 32 --conv cudnn \
    --warmup 3 --steps 10 --json "$work/bench_train_resnet152_b32_bf16_cudnn.json" \
    > "$work/bench_train_resnet152_b32_bf16_cudnn.txt" 2>&1
  log "regen bench train resnet152 b32 bf16 --conv cudnn exit $?"
  grep -E "step time|peak" "$work/bench_train_resnet152_b32_bf16_cudnn.txt"
  for model in transformer resnet152; do
    limited 120 "$regen" sweep --device cuda --precision bf16 --model "$model" --batches 32 \
      --policies dp --budgets 50% --steps 3 --out "$work/sweep_${model}_b32_bf16" \
      > "$work/sweep_${model}_b32_bf16.txt" 2>&1
    log "regen sweep $model b32 bf16 exit $?" ; grep -E "^   |no remat|error" "$work/sweep_${model}_b32_bf16.txt"
    grep -q "exact" "$work/sweep_${model}_b32_bf16.txt" || status=1
  done
  return $status
}

# batches: peak memory and step time against batch size (dp at 50%, predicted against measured).
phase_batches() {
  local spec model b
  for spec in resnet152:16 transformer:64 resnet152:64 transformer:128; do
    model=${spec%%:*}; b=${spec#*:}
    limited 100 "$regen" sweep --device cuda --math tf32 --model "$model" --batches "$b" --policies dp \
      --budgets 50% --steps 3 --out "$work/sweep_${model}_b$b" > "$work/sweep_${model}_b$b.txt" 2>&1
    log "regen sweep $model batch $b exit $?"
    grep -E "^   |no remat|error" "$work/sweep_${model}_b$b.txt"
  done
}

phase_probe() {
  {
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.max.sm \
      --format=csv
    echo "kernel $(uname -r) ($(uname -r | grep -q '^4\.4\.0' && echo gVisor || echo 'not gVisor'))"
    echo "nproc $(nproc); $(free -g | sed -n 2p)"
    command -v nvcc && nvcc --version | tail -2
    command -v cmake && cmake --version | head -1
    command -v ninja && ninja --version
    command -v g++ && g++ --version | head -1
    echo "compute-sanitizer: ${sanitizer:-not found}"; [ -n "$sanitizer" ] && "$sanitizer" --version | tail -1
    ls /usr/local/cuda/lib64/ 2> /dev/null | grep -E "^lib(cublas|cudnn|cudart)" | head -20
    echo "cudnn_root=${cudnn_root:-<toolkit>}"; [ -n "$cudnn_root" ] && ls "$cudnn_root/include" "$cudnn_root/lib"
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
                "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(0))'
    [ -d .gpu-deps ] && cat .gpu-deps/VERSIONS || echo ".gpu-deps not carried"
  } 2>&1 | tee "$work/probe.txt"
}

phase_build() {
  local args=(-DCMAKE_BUILD_TYPE=Release -DREGEN_CUDA=ON -DREGEN_CUDA_ARCHS=90)
  [ -d .gpu-deps ] && args+=(-DREGEN_DEPS_DIR="$PWD/.gpu-deps")
  [ -n "$cudnn_root" ] && args+=(-DREGEN_CUDNN_ROOT="$cudnn_root")
  if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja > /dev/null; then args+=(-G Ninja); fi
  limited 120 cmake -S . -B "$build" "${args[@]}" > "$work/configure.txt" 2>&1 \
    || { tail -40 "$work/configure.txt"; return 1; }
  grep "regen:" "$work/configure.txt"
  limited 420 cmake --build "$build" -j "$jobs" > "$work/build.txt" 2>&1 \
    || { grep -E "error|Error" "$work/build.txt" | head -30; tail -20 "$work/build.txt"; return 1; }
  log "built"
}

# The CUDA suites: every tests/test_cuda_* binary but test_cuda_runtime (a CPU suite of ctest's).
cuda_suites() {
  local t
  for t in "$build"/tests/test_cuda_*; do
    [ -x "$t" ] && [ "$(basename "$t")" != test_cuda_runtime ] && basename "$t"
  done
}

phase_test() {
  [ -x "$regen" ] || { log "no $regen: run the build phase first"; return 1; }
  local t rc status=0
  for t in $(cuda_suites); do
    REGEN_CUDA_SYNC=1 limited 150 "$build/tests/$t" > "$work/$t.txt" 2>&1; rc=$?
    log "$t (REGEN_CUDA_SYNC=1) exit $rc: $(grep -E '^\[doctest\] (test cases|assertions)' "$work/$t.txt" | tr '\n' ' ')"
    [ "$rc" -ne 0 ] && { status=1; grep -E "ERROR|FAILED|error|^regen:" "$work/$t.txt" | head -15; }
  done
  if [ ! -f "$build/CTestTestfile.cmake" ]; then  # a carried build: the CUDA suites only
    for t in $(cuda_suites); do
      limited 150 "$build/tests/$t" > "$work/${t}_async.txt" 2>&1; rc=$?
      log "$t exit $rc: $(grep -E '^\[doctest\] (test cases|assertions)' "$work/${t}_async.txt" | tr '\n' ' ')"
      [ "$rc" -ne 0 ] && { status=1; grep -E "ERROR|FAILED|error|^regen:" "$work/${t}_async.txt" | head -15; }
    done
    return $status
  fi
  (cd "$build" && limited 240 ctest -j "$jobs" --output-on-failure) > "$work/ctest.txt" 2>&1 \
    || status=1
  log "ctest (every suite, GPU ones included): $(grep -E 'tests passed|tests failed' "$work/ctest.txt")"
  grep -E "Not Run|Skipped|\*\*\*Failed|Failed  " "$work/ctest.txt" | head -20
  return $status
}

# sanitize_run TOOL NAME SHARE SUITE [ARGS...]: one compute-sanitizer run into $work/TOOL_NAME.txt.
sanitize_run() {
  local tool=$1 name=$2 share=$3 suite=$4 rc; shift 4
  REGEN_ALLOC_DIRECT=1 limited "$share" "$sanitizer" --tool "$tool" --error-exitcode 99 \
    --print-limit 50 "$build/tests/$suite" "$@" > "$work/${tool}_$name.txt" 2>&1; rc=$?
  log "$tool $name exit $rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$work/${tool}_$name.txt" | tail -1)"
  [ "$rc" -eq 99 ] && grep -E "^========= (Invalid|Race|Barrier|Uninit|Error)" "$work/${tool}_$name.txt" \
    | sort | uniq -c | sort -rn | head -10
  return $rc
}

phase_sanitize() {
  [ -x "$regen" ] || { log "no $regen: run the build phase first"; return 1; }
  [ -n "$sanitizer" ] || { log "compute-sanitizer not found"; return 1; }
  if uname -r | grep -q '^4\.4\.0'; then
    log "this machine runs gVisor: compute-sanitizer refuses the device there (Firecracker only)"
    return 1
  fi
  local status=0 run tc_rc
  # The kernels with shared memory and barriers; racecheck takes minutes over the convolutions
  # (their ResNet-152-sized cases), so they are a run of their own, last.
  local shared="attention,layernorm,softmax,cross_entropy,linear_cross_entropy,batchnorm,embedding,pool"
  local convs="conv2d*,conv_transpose2d*"
  for run in ${GPU_SANITIZE_RUNS:-memcheck_ops memcheck_op_table memcheck_autograd racecheck_ops \
             synccheck_ops memcheck_remat racecheck_conv memcheck_tc racecheck_tc synccheck_tc}; do
    case $run in
      memcheck_ops) sanitize_run memcheck ops 150 test_cuda_ops ;;
      memcheck_op_table) sanitize_run memcheck op_table 90 test_cuda_op_table ;;
      memcheck_autograd) sanitize_run memcheck autograd 90 test_cuda_autograd ;;
      racecheck_ops) sanitize_run racecheck ops 100 test_cuda_ops -tc="$shared" ;;
      synccheck_ops) sanitize_run synccheck ops 60 test_cuda_ops -tc="$shared,$convs" ;;
      memcheck_remat) sanitize_run memcheck remat 180 test_cuda_remat ;;
      racecheck_conv) sanitize_run racecheck conv 300 test_cuda_ops -tc="$convs" ;;
      memcheck_tc) sanitize_run memcheck conv_tc 90 test_cuda_conv_tc; tc_rc=$?
        sanitize_run memcheck attention_tc 90 test_cuda_attention_tc && [ $tc_rc -eq 0 ] ;;
      racecheck_tc) sanitize_run racecheck conv_tc 120 test_cuda_conv_tc; tc_rc=$?
        sanitize_run racecheck attention_tc 120 test_cuda_attention_tc && [ $tc_rc -eq 0 ] ;;
      synccheck_tc) sanitize_run synccheck conv_tc 60 test_cuda_conv_tc; tc_rc=$?
        sanitize_run synccheck attention_tc 60 test_cuda_attention_tc && [ $tc_rc -eq 0 ] ;;
      *) log "unknown sanitizer run $run"; false ;;
    esac || status=1
  done
  return $status
}

phase_kernels() {
  local math
  for math in tf32 fp32; do
    limited 200 "$regen" bench kernels --math "$math" > "$work/bench_kernels_$math.txt" 2>&1
    log "bench kernels --math $math exit $?"
    tail -70 "$work/bench_kernels_$math.txt"
  done
}

sweep() {  # sweep MODEL BATCHES SHARE: one regen sweep per batch, smallest first
  local model=$1 b
  for b in ${2//,/ }; do
    limited "$3" "$regen" sweep --device cuda --math tf32 --model "$model" --batches "$b" \
      --policies blocks,sqrt,mutwo,dp --budgets 70%,50%,lowest --steps 4 \
      --out "$work/sweep_${model}_b$b" --plot > "$work/sweep_${model}_b$b.txt" 2>&1
    log "regen sweep $model batch $b exit $?"
    grep -E "^   |no remat" "$work/sweep_${model}_b$b.txt"
  done
}

torch_baseline() {  # torch_baseline MODEL BATCHES SHARE
  PYTHONUNBUFFERED=1 limited "$3" python3 tools/torch_baseline.py --device cuda --model "$1" \
    --batches "$2" --modes eager,checkpoint,compile --math tf32 --csv "$work/torch_$1.csv" \
    > "$work/torch_$1.txt" 2>&1
  log "torch_baseline $1 exit $?"; cat "$work/torch_$1.txt" | grep -v Warning | tail -14
}

phase_resnet() { sweep resnet152 "${GPU_RESNET_BATCHES:-16,32,64,128}" 200; }
phase_transformer() { sweep transformer "${GPU_TRANSFORMER_BATCHES:-32,64,128,256}" 200; }
phase_torch() {
  torch_baseline resnet152 16,32,64,128 240
  torch_baseline transformer 32,64,128,256 240
}

phase_fit() {  # the largest batch whose plan fits 16 GiB: doubling, then bisection on plans
  local model policy lo hi mid
  for model in resnet152 transformer; do
    for policy in none blocks mutwo; do
      lo=0; hi=8
      fits() {  # one profile per batch, shared by the policies
        local d="$work/fit_${model}_b$1"
        if [ ! -f "$d/profile.json" ]; then
          mkdir -p "$d"
          limited 90 "$regen" profile --device cuda --math tf32 --model "$model" --batch "$1" --warmup 1 \
            --iterations 1 --out "$d" > "$d.log" 2>&1 || return 1
        fi
        "$regen" plan --profile "$d/profile.json" --policy "$policy" --budget 16GiB \
          --out "$d/plan_$policy.json" --decisions "$d/decisions_$policy.csv" \
          | grep -q "^  feasible"
      }
      while fits "$hi"; do lo=$hi; hi=$((hi * 2)); [ "$hi" -gt 4096 ] && break; done
      while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2)); if fits "$mid"; then lo=$mid; else hi=$mid; fi
      done
      if [ "$lo" -gt 0 ]; then  # measure it: 3 steps (under the plan's budget)
        local remat=(--policy "$policy" --budget 16GiB)
        [ "$policy" = none ] && remat=()
        limited 120 "$regen" train --device cuda --math tf32 --model "$model" --batch "$lo" --steps 3 \
          "${remat[@]}" --progress none > "$work/fit_train_${model}_$policy.txt" 2>&1
        log "train $model $policy batch $lo exit $?"
        grep -iE "peak|reserved|cudaMemGetInfo" "$work/fit_train_${model}_$policy.txt" | head -6
      fi
      echo "$model,$policy,16GiB,$lo" | tee -a "$work/fit.csv"
    done
  done
  rm -rf "$work"/fit_*_b*/trace.json
}

# timing: see the header. One sweep per model and timing; then, per run, the predicted and the
# measured overhead (profile.json's iteration_ms is the profiled step).
phase_timing() {
  local model t d
  for model in resnet152 transformer; do
    for t in device sync; do
      d="$work/timing_${model}_$t"
      limited 150 "$regen" sweep --device cuda --math tf32 --model "$model" --batches 32 \
        --policies mutwo,dp --budgets 70%,50%,lowest --steps 4 --op-timing "$t" --out "$d" \
        > "$d.txt" 2>&1
      log "regen sweep $model batch 32 --op-timing $t exit $?"
      python3 - "$d" "$model" "$t" << 'PY' 2>&1 | tee -a "$work/timing.txt"
import csv, json, sys
d, model, t = sys.argv[1:4]
it = json.load(open(f"{d}/{model}_b32_profile.json"))["measured"]["iteration_ms"] / 1e3
for r in csv.DictReader(open(f"{d}/{model}_summary.csv")):
    meas = float(r["final_time_s"]) / float(r["initial_time_s"]) - 1
    pred = float(r["predicted_time_s"]) / it - 1
    # recompute_s: the programs' time on the device's clock (events, since 2026-11-27): where
    # a plan's extra time goes, in its programs or elsewhere in the step.
    rec_pred = float(r["predicted_time_s"]) - it
    print(f"{model},{t},{r['policy']},{r['budget']},profiled {it*1e3:.1f} ms,"
          f"trained {float(r['initial_time_s'])*1e3:.1f} ms,predicted {pred*100:+.1f}%,"
          f"measured {meas*100:+.1f}%,extra step {(float(r['final_time_s']) - float(r['initial_time_s']))*1e3:.1f} ms,"
          f"programs predicted {rec_pred*1e3:.1f} ms,measured {float(r['recompute_s'])*1e3:.1f} ms")
PY
    done
  done
}

# offload: see the header. The suite, then one profile and three plans of dp with every fate.
phase_offload() {
  local dev="${GPU_SESSION_DEVICE:-cuda}" model="${GPU_OFFLOAD_MODEL:-resnet152}"
  local size="${GPU_OFFLOAD_SIZE:-224}" batch="${GPU_OFFLOAD_BATCH:-32}" math=() b d rc status=0
  [ "$dev" = cuda ] && math=(--math tf32)
  limited 60 "$regen" bench copy --device "$dev" --json "$work/copy_$dev.json" \
    > "$work/bench_copy.txt" 2>&1
  log "regen bench copy exit $?"; cat "$work/bench_copy.txt"
  if [ "$dev" = cuda ]; then
    limited 180 "$build/tests/test_cuda_offload" -s > "$work/test_cuda_offload.txt" 2>&1
    rc=$?; log "test_cuda_offload exit $rc"; [ $rc -eq 0 ] || status=1
    grep -E "MESSAGE|measured transfer|predicted wait|test cases|assertions" "$work/test_cuda_offload.txt"
  fi
  d="$work/offload_${model}_b$batch"
  mkdir -p "$d"
  limited 150 "$regen" profile --device "$dev" "${math[@]}" --model "$model" --image-size "$size" \
    --batch "$batch" --warmup 2 --iterations 2 --out "$d" > "$d.log" 2>&1
  log "regen profile $model batch $batch exit $?"; tail -1 "$d.log"
  for b in 33% 25% lowest; do
    "$regen" plan --profile "$d/profile.json" --policy dp --offload all --transfer profile \
      --budget "$b" --out "$d/plan_$b.json" --decisions "$d/decisions_$b.csv" > "$d/plan_$b.txt" 2>&1
    log "regen plan dp+all at $b exit $?"; cat "$d/plan_$b.txt"
    grep -q "^  feasible" "$d/plan_$b.txt" || continue
    limited 120 "$regen" train --device "$dev" "${math[@]}" --model "$model" --image-size "$size" \
      --batch "$batch" --steps 4 --profile "$d/profile.json" --plan "$d/plan_$b.json" \
      --progress none > "$d/train_$b.txt" 2>&1
    rc=$?; log "regen train under dp+all at $b exit $rc"; [ $rc -eq 0 ] || status=1
    grep -E "remat|host tier|step time|peak memory" "$d/train_$b.txt"
  done
  rm -f "$d/trace.json"
  return $status
}

[ $# -gt 0 ] || { sed -n 2,30p "$0"; exit 2; }
status=0
for p in "$@"; do
  declare -F "phase_$p" > /dev/null || { log "unknown phase $p"; status=2; continue; }
  log "phase $p"
  "phase_$p" || { log "phase $p failed"; status=1; }
  pack "$p"
done
exit $status
