// Stream capture in the host emulation (scripts/cuda-emu): while the one emulated stream captures
// (cudaStreamBeginCapture .. cudaStreamEndCapture, emu_runtime.cpp), kernel launches, async copies
// and memsets, and the cuBLAS and CUB stand-ins' work are recorded as closures instead of run;
// cudaGraphLaunch runs a graph's closures in the order they were recorded. Every argument is taken
// by value when the work is recorded (cuBLAS's host alpha and beta included, as cuBLAS reads them
// at the call), so a replay reads device memory when it runs, as a real graph does.
#pragma once
#include <functional>
#include <utility>

namespace emu {
bool capturing();
void record(std::function<void()> work);
template <class F>
void run_or_record(F&& work) {
  if (capturing()) {
    record(std::function<void()>(std::forward<F>(work)));
  } else {
    work();
  }
}
}  // namespace emu
