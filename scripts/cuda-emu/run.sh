#!/usr/bin/env bash
# Builds regen's CUDA kernels for a host emulation of the CUDA execution model and runs the
# CUDA-vs-CPU checks on small shapes (README.md). Not part of the CMake build or of CI: a
# verification aid for machines without a GPU. Usage:
#   scripts/cuda-emu/run.sh [ops|optable|allocator|autograd|remat|dryrun|tc|flash|graph|all] [doctest args, e.g. -tc="emu conv2d"]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/scripts/cuda-emu
B=${EMU_BUILD:-/tmp/regen-cuda-emu}
JOBS=${JOBS:-2}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
what=${1:-ops}
[ $# -gt 0 ] && shift
mkdir -p "$B/gen" "$B/obj" "$B/include"
# Headers include each other as "regen/<layer>/...": the same links the CMake build makes.
ln -sfn "$ROOT" "$B/include/regen"
export CXXCMD="${CXX:-g++} -std=c++20 -O1 -w -fopenmp -I$HERE -I$HERE/stand-ins -I$B/include -I$ROOT -I$CUDA_INC \
  -I/usr/include/eigen3 -DREGEN_WITH_CUDA=1"
defs=""
for fam in conv2d batchnorm pool embedding layernorm softmax attention cross_entropy optim; do
  up=$(echo "$fam" | tr a-z A-Z)
  if [ -f "$ROOT/kernels/cpu/$fam.cpp" ]; then defs="$defs -DREGEN_HAVE_CPU_$up=1"; else defs="$defs -DREGEN_HAVE_CPU_$up=0"; fi
done
for f in "$ROOT"/kernels/cuda/*.cu "$ROOT"/core/cuda/*.cu; do python3 "$HERE/transform.py" "$f" "$B/gen/$(basename "$f" .cu).cpp" > /dev/null; done
srcs=$(ls "$B"/gen/*.cpp "$ROOT"/kernels/cuda/*.cpp "$ROOT"/kernels/cpu/*.cpp "$ROOT"/kernels/dispatch.cpp \
  "$ROOT"/autograd/*.cpp "$ROOT"/core/*.cpp "$ROOT"/models/*.cpp "$ROOT"/dist/*.cpp \
  "$ROOT"/remat/*.cpp "$ROOT"/remat/*/*.cpp "$ROOT"/remat/plan/planners/*.cpp "$ROOT"/session/*.cpp "$ROOT"/core/cuda/graph.cpp "$HERE"/emu_runtime.cpp)
# One object per source, named after its folder and file; rebuilt when the source, or any header
# of the tree (coarse, but a changed inline function reaches every object that uses it), is newer.
newest_header=$(find "$ROOT"/core "$ROOT"/kernels "$ROOT"/autograd "$ROOT"/models "$ROOT"/dist "$ROOT"/remat "$ROOT"/session \
  "$HERE" \( -name '*.h' -o -name '*.cuh' \) -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
export newest_header
echo "$srcs" | xargs -P "$JOBS" -I{} sh -c '
  src={}; obj='"$B"'/obj/$(basename $(dirname $src))_$(basename $src .cpp).o
  if [ ! -f $obj ] || [ $src -nt $obj ] || [ "$newest_header" -nt $obj ]; then
    $CXXCMD -c $src -o $obj || exit 255
  fi'
# The objects of today's sources only: one left in $B by a file since moved or removed would clash.
objs=$(for src in $srcs; do echo "$B/obj/$(basename "$(dirname "$src")")_$(basename "$src" .cpp).o"; done)
build_test() {  # name source
  $CXXCMD $defs -c "$2" -o "$B/$1.o"
  $CXXCMD -o "$B/$1" "$B/$1.o" $objs -lpthread
}
run() { echo "== $1"; OMP_NUM_THREADS=1 "$B/$1" "${@:2}"; }
wrap() {  # a doctest main around a test file
  printf '#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN\n#include <doctest/doctest.h>\n#include "%s"\n' "$1" > "$B/$2.cpp"
  echo "$B/$2.cpp"
}
case $what in
  ops) build_test emu_ops "$HERE/emu_ops.cpp"; run emu_ops "$@" ;;
  optable) CXXCMD="$CXXCMD -DREGEN_TEST_DATA=\"$ROOT/tests/data\"" \
             build_test emu_optable "$(wrap tests/cuda/test_cuda_op_table.cpp emu_optable_main)"
           run emu_optable "$@" ;;
  allocator) build_test emu_allocator "$(wrap tests/cuda/test_cuda_allocator.cpp emu_allocator_main)"
             run emu_allocator "$@" ;;
  autograd) build_test emu_autograd "$(wrap tests/cuda/test_cuda_autograd.cpp emu_autograd_main)"
            run emu_autograd -tce="*feed-forward*" "$@" ;;
  remat) build_test emu_remat "$(wrap tests/cuda/test_cuda_remat.cpp emu_remat_main)"
         run emu_remat "$@" ;;
  dryrun) CXXCMD="$CXXCMD -DREGEN_TEST_DATA=\"$ROOT/tests/data\"" \
            build_test emu_dryrun "$(wrap tests/cuda/test_cuda_dry_run.cpp emu_dryrun_main)"
          run emu_dryrun "$@" ;;
  tc) CXXCMD="$CXXCMD -DREGEN_CUDA_EMU=1" \
        build_test emu_tc "$(wrap tests/cuda/test_cuda_conv_tc.cpp emu_tc_main)"
      run emu_tc "$@" ;;
  flash) CXXCMD="$CXXCMD -DREGEN_CUDA_EMU=1" \
           build_test emu_flash "$(wrap tests/cuda/test_cuda_attention_tc.cpp emu_flash_main)"
         run emu_flash "$@" ;;
  graph) build_test emu_graph "$(wrap tests/cuda/test_cuda_graph.cpp emu_graph_main)"
         run emu_graph "$@" ;;
  all) "$0" ops "$@"; "$0" optable; "$0" allocator; "$0" autograd; "$0" remat; "$0" dryrun; "$0" tc; "$0" flash; "$0" graph ;;
  *) echo "usage: $0 [ops|optable|allocator|autograd|remat|dryrun|tc|flash|graph|all] [doctest args]" >&2; exit 2 ;;
esac
