// The CUDA-vs-CPU cases of tests/cuda/test_cuda_ops.cpp for the host emulation
// (scripts/cuda-emu/run.sh ops): the same TEST_CASEs, each running the small shapes of its
// kEmulated branch. The cases live in that file only.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#define REGEN_CUDA_EMU 1
#include <doctest/doctest.h>

#include "tests/cuda/test_cuda_ops.cpp"
