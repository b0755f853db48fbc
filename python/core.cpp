// parm._core: the C++ side of the Python package (pybind11). The process (MPI) and its
// topology, and the MoE layer over memory the caller owns: every tensor crosses as a data
// pointer of a contiguous float32 buffer whose shape, dtype and device the Python side
// (parm/torch.py) checked; nothing is copied here beyond what MoeLayer itself does.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process.h"
#include "moe/moe_layer.h"
#include "moe/reference_moe.h"
#include "parm/error.h"
#include "parm/topology.h"
#include "perfmodel/model.h"
#include "perfmodel/profile.h"
#include "schedule/schedule.h"

namespace py = pybind11;

namespace parm {
namespace {

// The process's topology from the last successful init(); MoE layers keep theirs alive.
std::shared_ptr<Topology>& current_topology() {
  static std::shared_ptr<Topology> topo;
  return topo;
}
bool& mpi_started() {
  static bool started = false;
  return started;
}

Topology& topology(const char* what) {
  auto& t = current_topology();
  if (!t) throw Error(fmt::format("{} before parm.init(): call parm.init(mp=, ep=, esp=) first", what));
  return *t;
}

void init(int mp, int ep, int esp, int ranks_per_node, const std::string& device,
          double timeout_s) {
  TopologyOptions o;
  o.mp = mp;
  o.ep = ep;
  o.esp = esp;
  PARM_CONFIG_CHECK(ranks_per_node >= 0, "ranks_per_node {} must be None or at least 1",
                    ranks_per_node);
  o.ranks_per_node = ranks_per_node;
  PARM_CONFIG_CHECK(timeout_s > 0, "timeout {} s must be positive", timeout_s);
  o.timeout_s = timeout_s;
  o.device = parse_device(device);
  check_device(o.device);
  if (!mpi_started()) {
    process::init(nullptr, nullptr);
    mpi_started() = true;
  }
  current_topology() = Topology::create(o);
}

void finalize() {
  current_topology().reset();
  if (mpi_started()) process::finalize();
}

float* ptr(uintptr_t p) { return reinterpret_cast<float*>(p); }

// One MoE layer for T tokens per MP group, over caller-owned parameters and gradients.
class PyLayer {
 public:
  PyLayer(int64_t tokens, int64_t model_dim, int64_t hidden, int64_t experts, int topk,
          const std::string& capacity_factor, const std::string& kind, bool fuse,
          const std::string& precision)
      : topo_(current_topology()) {
    topology("parm.torch.MoE");
    const MoeShape shape = MoeShape::of(tokens, model_dim, hidden, experts, topk, capacity_factor);
    layer_ = std::make_unique<MoeLayer>(*topo_, shape, schedule::parse_kind(kind), fuse, 4,
                                        parse_precision(precision));
    layer_->set_step_timing(false);
  }

  // The shapes of this rank's shards: (local experts, shard hidden, first expert, esp rank,
  // esp size).
  std::vector<int64_t> shard_info() const {
    return {layer_->params().experts.w1.dim(0), layer_->shard_hidden(), layer_->first_expert(),
            layer_->esp_rank(), layer_->esp_size()};
  }
  std::string schedule_name() const {
    return std::string(schedule::kind_name(layer_->schedule().kind)) +
           (layer_->schedule().fused ? "+fused" : "");
  }

  // The layer computes on these buffers (views; the caller keeps them alive and unmoved).
  void set_params(uintptr_t wg, uintptr_t w1, uintptr_t b1, uintptr_t w2, uintptr_t b2) {
    point(layer_->params(), wg, w1, b1, w2, b2);
  }
  void set_grads(uintptr_t wg, uintptr_t w1, uintptr_t b1, uintptr_t w2, uintptr_t b2) {
    point(layer_->grads(), wg, w1, b1, w2, b2);
  }

  // out (T, M) for x (T, M); returns l_aux.
  float forward(uintptr_t x, uintptr_t out) {
    const auto& s = layer_->shape();
    const Device d = layer_->device();
    {
      py::gil_scoped_release nogil;
      const Tensor& y = layer_->forward(Tensor::view(ptr(x), {s.tokens, s.model_dim}, d));
      Tensor::view(ptr(out), y.shape(), d).copy_from(y);
    }
    ++forwards_;
    return layer_->l_aux();
  }
  // dx (T, M) for dout (T, M) of forward number `forward_id`; the gradients go into the
  // buffers of set_grads (overwritten, not accumulated).
  void backward(int64_t forward_id, uintptr_t dout, float dl_aux, uintptr_t dx) {
    if (forward_id != forwards_)
      throw Error(fmt::format(
          "parm.torch.MoE: backward of forward {} but the layer has run forward {} since; "
          "the layer keeps the state of its last forward only, so call backward before the "
          "next forward with the same number of tokens",
          forward_id, forwards_));
    const auto& s = layer_->shape();
    const Device d = layer_->device();
    py::gil_scoped_release nogil;
    layer_->zero_grad();
    const Tensor& g = layer_->backward(Tensor::view(ptr(dout), {s.tokens, s.model_dim}, d),
                                       dl_aux);
    Tensor::view(ptr(dx), g.shape(), d).copy_from(g);
  }
  int64_t forwards() const { return forwards_; }

 private:
  static void point(MoeLayerParams& p, uintptr_t wg, uintptr_t w1, uintptr_t b1, uintptr_t w2,
                    uintptr_t b2) {
    const Device d = p.wg.device();
    p.wg = Tensor::view(ptr(wg), p.wg.shape(), d);
    p.experts.w1 = Tensor::view(ptr(w1), p.experts.w1.shape(), d);
    p.experts.b1 = Tensor::view(ptr(b1), p.experts.b1.shape(), d);
    p.experts.w2 = Tensor::view(ptr(w2), p.experts.w2.shape(), d);
    p.experts.b2 = Tensor::view(ptr(b2), p.experts.b2.shape(), d);
  }

  std::shared_ptr<Topology> topo_;
  std::unique_ptr<MoeLayer> layer_;
  int64_t forwards_ = 0;
};

// The whole parameters of seed `seed` (as check-layer and the trainer draw them) into
// caller buffers of the whole shapes.
void init_params(int64_t model_dim, int64_t hidden, int64_t experts, uint64_t seed,
                 uintptr_t wg, uintptr_t w1, uintptr_t b1, uintptr_t w2, uintptr_t b2) {
  const MoeShape shape = MoeShape::of(1, model_dim, hidden, experts, 1, "1");
  const auto p = ref::init_params<float>(shape, seed);
  auto put = [](const std::vector<float>& v, uintptr_t dst) {
    std::copy(v.begin(), v.end(), ptr(dst));
  };
  put(p.wg, wg);
  put(p.w1, w1);
  put(p.b1, b1);
  put(p.w2, w2);
  put(p.b2, b2);
}

// The cost model's pick among `kinds` x `fuse_modes` for this shape on the current topology
// (what `bench-layer --schedule auto` runs): (schedule name, fused).
std::pair<std::string, bool> choose_schedule(int64_t tokens, int64_t model_dim, int64_t hidden,
                                             int64_t experts, int topk,
                                             const std::string& capacity_factor,
                                             const std::string& profile_path,
                                             const std::vector<std::string>& kinds,
                                             const std::vector<bool>& fuse_modes) {
  Topology& topo = topology("parm.torch.MoE");
  const MoeShape shape = MoeShape::of(tokens, model_dim, hidden, experts, topk, capacity_factor);
  std::vector<schedule::Kind> ks;
  for (const auto& k : kinds) ks.push_back(schedule::parse_kind(k));
  const auto profile = perfmodel::read_profile(profile_path);
  const auto cands = perfmodel::predict_candidates(profile, shape, perfmodel::target_of(topo), 4,
                                                   ks, fuse_modes);
  const auto& best = cands[perfmodel::choose(cands)];
  return {schedule::kind_name(best.kind), best.fuse};
}

}  // namespace
}  // namespace parm

PYBIND11_MODULE(_core, m) {
  using namespace parm;
  m.doc() = "Parm's C++ runtime (use the parm package, not this module)";
  static py::exception<Timeout> timeout_error(m, "TimeoutError", PyExc_TimeoutError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Timeout& e) {
      timeout_error(e.what());
    } catch (const InvalidConfig& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  m.def("init", &init, py::arg("mp"), py::arg("ep"), py::arg("esp"), py::arg("ranks_per_node"),
        py::arg("device"), py::arg("timeout"));
  m.def("finalize", &finalize);
  m.def("initialized", [] { return current_topology() != nullptr; });
  m.def("rank", [] { return topology("parm.rank()").world_rank(); });
  m.def("world_size", [] { return topology("parm.world_size()").layout().world; });
  m.def("layout", [] {
    const Layout& l = topology("parm.layout()").layout();
    return py::dict(py::arg("world") = l.world, py::arg("mp") = l.mp, py::arg("ep") = l.ep,
                    py::arg("esp") = l.esp, py::arg("dp") = l.dp, py::arg("edp") = l.edp);
  });
  m.def("group_ranks", [](const std::string& group) {
    Topology& t = topology("parm.group_ranks()");
    return group_members(t.layout(), parse_group(group), t.world_rank());
  });
  m.def("group_rank", [](const std::string& group) {
    Topology& t = topology("parm.group_rank()");
    return group_coord(t.layout(), parse_group(group), t.world_rank()).rank;
  });
  m.def("device", [] { return std::string(device_name(topology("parm.device()").device())); });
  // Sum of n floats at host address p over this rank's group `group` (in place).
  m.def("allreduce_sum", [](uintptr_t p, int64_t n, const std::string& group) {
    Communicator& c = topology("parm.allreduce_sum()").host_comm(parse_group(group));
    py::gil_scoped_release nogil;
    c.allreduce(ptr(p), static_cast<size_t>(n));
  }, py::arg("p"), py::arg("n"), py::arg("group") = "world");
  // Tests: throws Parm's error of `kind` ("timeout", "config", "error") with `message`, to
  // check the translation into Python exceptions without a stuck job.
  m.def("_throw_for_test", [](const std::string& kind, const std::string& message) {
    if (kind == "timeout") throw Timeout(message);
    if (kind == "config") throw InvalidConfig(message);
    throw Error(message);
  });
  m.def("init_params", &init_params);
  m.def("choose_schedule", &choose_schedule);

  py::class_<PyLayer>(m, "Layer")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int, const std::string&,
                    const std::string&, bool, const std::string&>())
      .def("shard_info", &PyLayer::shard_info)
      .def("schedule_name", &PyLayer::schedule_name)
      .def("set_params", &PyLayer::set_params)
      .def("set_grads", &PyLayer::set_grads)
      .def("forward", &PyLayer::forward)
      .def("backward", &PyLayer::backward)
      .def("forwards", &PyLayer::forwards);
}
