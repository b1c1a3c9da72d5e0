// CUDA graphs of the compute stream: capture, instantiation and replay of a training step
// (remat/execute/cuda_graph.h CudaGraphStep uses them; docs/memory.md, "One CUDA graph per
// step"). Compiled only when REGEN_WITH_CUDA is defined. The host emulation (scripts/cuda-emu)
// compiles this file unchanged over its stand-ins of the CUDA graph calls. Tests:
// tests/cuda/test_cuda_graph.cpp.
//
// Capture mode: cudaStreamCaptureModeThreadLocal. The capturing thread may then make no call that
// could synchronize with or allocate outside the capture (cudaMalloc, cudaMemcpy to pageable
// memory, a synchronize): CUDA refuses it with cudaErrorStreamCaptureUnsupported, so a step that
// allocated outside regen's planned arena fails its capture instead of recording an address that
// moves. Other threads (the copy queues', a data loader's) are not restricted, as they would be in
// cudaStreamCaptureModeGlobal: none of them issues work on the compute stream.
#pragma once

#ifdef REGEN_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace regen::cuda {

// Whether the current device's compute stream is capturing now. Runtime calls that would wait for
// the device (core/cuda/runtime.h synchronize, memcpy to or from the host) consult it.
bool capturing();
// The error a copy between the host and the device gets while the step is captured: the step reads
// a device value on the host (a loss, a norm, a finite check) or writes one from it, which a graph
// cannot replay. Thrown as regen::Error naming the copy.
[[noreturn]] void refuse_host_copy_in_capture(uint64_t bytes, cudaMemcpyKind kind);

// An instantiated graph of the compute stream's work; launch() replays it on that stream.
// Move-only; destroys the graph and its executable with it.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  bool valid() const { return exec_ != nullptr; }
  // Queues the graph on the compute stream; returns at once (synchronize() waits for it).
  void launch();

 private:
  friend Graph end_capture();
  void reset() noexcept;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Begins capturing the compute stream (thread-local mode, above). Throws regen::Error when it is
// capturing already.
void begin_capture();
// Ends the capture and instantiates its graph. Throws regen::Error naming CUDA's error when the
// capture was invalidated (an unsupported call while capturing).
Graph end_capture();
// Ends a capture that failed half-way (an exception in the captured step) and drops what it
// recorded; does nothing when the stream is not capturing. Never throws.
void abandon_capture() noexcept;

// The device word (a uint64_t in device memory, or nullptr) that every Philox kernel adds to the
// stream index it was launched with (dropout, attention's dropout). A captured step holds its
// streams' indices as kernel arguments; writing the word before each replay moves them on by the
// streams an uncaptured step draws, so every replay draws the masks the step it stands for would
// draw. nullptr (outside captured steps): the kernels read nothing.
const uint64_t* rng_stream_offset();
void set_rng_stream_offset(const uint64_t* device_word);

}  // namespace regen::cuda
#endif
