// A CUDA graph of work queued on the process's compute stream (kernels/cuda/runtime.h):
// captured once, launched as one unit. CUDA builds only; no CUDA headers here.
#pragma once

#include <functional>
#include <string>

namespace parm::cuda {

class StreamGraph {
 public:
  StreamGraph() = default;
  ~StreamGraph();
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;

  // Records what `work` queues on cuda::stream() (nothing runs), replacing any earlier graph.
  // Returns false, holding no graph and with the stream out of capture, when the capture
  // failed: `work` threw, or queued something a graph cannot hold. `work` must not wait for
  // the GPU.
  bool capture(const std::function<void()>& work);
  // Queues the graph on cuda::stream() (a graph must be held).
  void launch();
  bool ready() const { return exec_ != nullptr; }
  void reset();
  // Why the last failed capture failed (empty when none failed).
  const std::string& failure() const { return failure_; }

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
  std::string failure_;
};

}  // namespace parm::cuda
