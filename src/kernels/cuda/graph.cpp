// StreamGraph (graph.h): stream capture into a graph, instantiated once, launched on the
// compute stream.
#include "kernels/cuda/graph.h"

#include <exception>
#include <string>

#include "kernels/cuda/runtime.h"
#include "parm/error.h"

namespace parm::cuda {

StreamGraph::~StreamGraph() { reset(); }

void StreamGraph::reset() {
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  exec_ = nullptr;
}

bool StreamGraph::capture(const std::function<void()>& work) {
  reset();
  cudaStream_t s = stream();
  // Thread-local: only this thread's calls are checked against the capture.
  PARM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  std::string failure;
  try {
    work();
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "an exception";
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  if (failure.empty() && ended != cudaSuccess)
    failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended);
  if (failure.empty() && graph != nullptr) {
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    if (made == cudaSuccess)
      exec_ = exec;
    else
      failure = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(made);
  }
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  const bool ok = exec_ != nullptr;
  if (!ok) {
    (void)cudaGetLastError();  // the failed capture's error is not the next call's
    failure_ = failure.empty() ? "no graph captured" : failure;
  }
  return ok;
}

void StreamGraph::launch() {
  PARM_CHECK(exec_ != nullptr, "StreamGraph::launch: no graph was captured");
  PARM_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream()));
}

}  // namespace parm::cuda
