// CUDA graphs of the compute stream (graph.h).
#include "regen/core/cuda/graph.h"

#include <cstdio>
#include <utility>

#include "regen/core/cuda/runtime.h"

namespace regen::cuda {

namespace {
const uint64_t* g_rng_stream_offset = nullptr;
}  // namespace

bool capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  REGEN_CUDA_CHECK(cudaStreamIsCapturing(stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

void refuse_host_copy_in_capture(uint64_t bytes, cudaMemcpyKind kind) {
  const char* what = kind == cudaMemcpyDeviceToHost ? "from cuda:" : "to cuda:";
  REGEN_FAIL("CUDA graph capture: a copy of ", bytes, " bytes ", what, current_device(),
             kind == cudaMemcpyDeviceToHost ? " to the host" : " from the host",
             " while the step is captured: the step ",
             kind == cudaMemcpyDeviceToHost ? "reads a device value on the host"
                                            : "writes device memory from the host",
             " (a loss, a norm, a finite check), which a replayed graph cannot do; the step runs "
             "uncaptured (--cuda-graph off)");
}

Graph::~Graph() {
  reset();
}

Graph::Graph(Graph&& other) noexcept
    : graph_(std::exchange(other.graph_, nullptr)), exec_(std::exchange(other.exec_, nullptr)) {}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    reset();
    graph_ = std::exchange(other.graph_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

void Graph::reset() noexcept {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
}

void Graph::launch() {
  REGEN_CHECK(exec_ != nullptr, "CUDA graph: launch of a graph that was never instantiated");
  REGEN_CUDA_CHECK(cudaGraphLaunch(exec_, stream()));
}

void begin_capture() {
  REGEN_CHECK(!capturing(), "CUDA graph: the compute stream of cuda:", current_device(),
              " is capturing already (one captured step at a time)");
  REGEN_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
}

Graph end_capture() {
  cudaGraph_t graph = nullptr;
  REGEN_CUDA_CHECK(cudaStreamEndCapture(stream(), &graph));
  Graph out;
  out.graph_ = graph;
  REGEN_CUDA_CHECK(cudaGraphInstantiateWithFlags(&out.exec_, graph, 0));
  return out;
}

void abandon_capture() noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream(), &status) != cudaSuccess) return;
  if (status == cudaStreamCaptureStatusNone) return;
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream(), &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // an invalidated capture leaves its error behind
}

const uint64_t* rng_stream_offset() {
  return g_rng_stream_offset;
}

void set_rng_stream_offset(const uint64_t* device_word) {
  g_rng_stream_offset = device_word;
}

}  // namespace regen::cuda
