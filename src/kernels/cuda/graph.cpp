// StreamGraph (graph.h): stream capture into a graph, instantiated once, launched on the
// compute stream.
#include "kernels/cuda/graph.h"

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
  bool threw = false;
  try {
    work();
  } catch (...) {
    threw = true;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  bool ok = !threw && ended == cudaSuccess && graph != nullptr;
  if (ok) {
    cudaGraphExec_t exec = nullptr;
    ok = cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (ok) exec_ = exec;
  }
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  if (!ok) (void)cudaGetLastError();  // the failed capture's error is not the next call's
  return ok;
}

void StreamGraph::launch() {
  PARM_CHECK(exec_ != nullptr, "StreamGraph::launch: no graph was captured");
  PARM_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream()));
}

}  // namespace parm::cuda
