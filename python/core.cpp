// parm._core: the C++ side of the Python package (pybind11). The process (MPI) and its
// topology, and the MoE layer over memory the caller owns: every tensor crosses as a DLPack
// capsule, checked here (dtype, device, contiguity, shape; dlpack_tensor.h) and used in
// place. Results are written into the caller's tensors (MoeLayer::forward_into /
// backward_into), so nothing is copied here beyond what MoeLayer itself does.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "comm/process.h"
#include "dlpack_tensor.h"
#include "kernels/cpu/kernels.h"
#include "tensor_pool.h"
#include "torch_group.h"
#include "moe/moe_layer.h"
#include "moe/reference_moe.h"
#include "parm/error.h"
#include "parm/topology.h"
#include "perfmodel/model.h"
#include "perfmodel/profile.h"
#include "schedule/schedule.h"
#include "shape/router.h"

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

void init(int mp, int ep, int esp, int pp, const std::string& order, int ranks_per_node,
          const std::string& device, double timeout_s) {
  TopologyOptions o;
  o.mp = mp;
  o.ep = ep;
  o.esp = esp;
  o.pp = pp;
  o.order = order;
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

// parm.init(backend="torch"): the topology over torch.distributed's groups (torch_group.h);
// no MPI call is made.
void init_torch(int world, int mp, int ep, int esp, int pp, const std::string& order,
                double timeout_s, int world_rank, const std::vector<int>& node_of_rank,
                const py::dict& groups, const std::string& device) {
  current_topology() = py_torch::adopt(world, mp, ep, esp, pp, order, timeout_s, world_rank,
                                       node_of_rank, groups, device);
}

// Set once a collective of this process failed (Timeout, CommError): MPI may still hold its
// requests, so the process cannot finalize MPI cleanly.
bool& comm_failed() {
  static bool failed = false;
  return failed;
}

// At exit: MPI_Finalize, or, after a failed collective or when `abort` (the script ended on
// an uncaught exception), MPI_Abort, which ends every rank of the job so that none waits
// for this one.
// Without MPI (the torch backend): std::_Exit(1), skipping every destructor (torch's stuck
// work would block them); the launcher (torchrun) then ends the other ranks.
void finalize(bool abort) {
  if (abort || comm_failed()) {
    if (mpi_started()) process::abort_job(1);
    if (current_topology()) std::_Exit(1);
  }
  current_topology().reset();
  if (mpi_started()) process::finalize();
}

using py_dlpack::view;
constexpr const char* kLayerOp = "parm.torch.MoE";

// parm.torch.MoE's router and expert-kind arguments (router_score, router_topk_norm,
// router_scale, router_groups, router_group_topk, expert_mlp, shared_experts, shared_hidden,
// shared_gate) and how it runs (shared_overlap, pad_to_capacity), as the package passes them;
// checked by MoeShape::validate with the shape.
using KindArgs = std::tuple<std::string, bool, double, int, int, std::string, int, int64_t, bool,
                            bool, bool>;

RouterSpec router_of(const KindArgs& a) {
  RouterSpec r;
  r.score = parse_router_score(std::get<0>(a));
  r.topk_norm = std::get<1>(a);
  r.scale = static_cast<float>(std::get<2>(a));
  r.groups = std::get<3>(a);
  r.group_topk = std::get<4>(a);
  return r;
}

MoeShape layer_shape(int64_t tokens, int64_t model_dim, int64_t hidden, int64_t experts,
                     int topk, const std::string& capacity_factor, const KindArgs& router) {
  MoeShape shape = MoeShape::of(tokens, model_dim, hidden, experts, topk, capacity_factor);
  shape.router = router_of(router);
  shape.expert_mlp = parse_expert_mlp(std::get<5>(router));
  shape.shared_experts = std::get<6>(router);
  shape.shared_hidden = std::get<7>(router);
  shape.shared_gate = std::get<8>(router);
  shape.shared_overlap = std::get<9>(router);
  shape.pad_to_capacity = std::get<10>(router);
  return shape;
}

// One MoE layer for T tokens per MP group, over caller-owned parameters and gradients.
class PyLayer {
 public:
  PyLayer(int64_t tokens, int64_t model_dim, int64_t hidden, int64_t experts, int topk,
          const std::string& capacity_factor, const KindArgs& router, const std::string& kind,
          bool fuse, const std::string& precision)
      : topo_(current_topology()) {
    topology("parm.torch.MoE");
    const MoeShape shape =
        layer_shape(tokens, model_dim, hidden, experts, topk, capacity_factor, router);
    layer_ = std::make_unique<MoeLayer>(*topo_, shape, schedule::parse_kind(kind), fuse,
                                        fused_plan::kDefaultChunks,
                                        parse_precision(precision));
    layer_->set_step_timing(false);
  }

  // The shapes of this rank's shards: (local experts, shard hidden, first expert, esp rank,
  // esp size).
  std::vector<int64_t> shard_info() const {
    return {layer_->params().experts.w1.dim(0), layer_->shard_hidden(), layer_->first_expert(),
            layer_->esp_rank(), layer_->esp_size()};
  }
  std::string schedule_name() const { return layer_->schedule().name(); }

  // The layer computes on these tensors' memory (the caller keeps them alive and unmoved
  // while the layer uses them).
  // The tensors the layer has, in the order of ref::MoeParams::named() (wg, w1, b1, w2, b2,
  // w3, sw1, sb1, sw2, sb2, sw3, swg): a capsule where it has the tensor, None where not.
  void set_params(const std::vector<py::object>& tensors) {
    point(layer_->params(), "", tensors);
  }
  void set_grads(const std::vector<py::object>& tensors) {
    point(layer_->grads(), "gradient of ", tensors);
  }

  // out (T, M) for x (T, M), written into out's memory; returns l_aux.
  float forward(const py::capsule& x, const py::capsule& out) {
    const Tensor xv = view(x, kLayerOp, "x", device(), tokens_shape());
    const Tensor ov = view(out, kLayerOp, "the output", device(), tokens_shape());
    {
      py::gil_scoped_release nogil;
      layer_->forward_into(xv, ov);
    }
    ++forwards_;
    return layer_->l_aux();
  }
  // dx (T, M), written into dx's memory, for dout (T, M) of forward number `forward_id`; the
  // gradients go into the tensors of set_grads (overwritten, not accumulated).
  void backward(int64_t forward_id, const py::capsule& dout, float dl_aux,
                const py::capsule& dx) {
    if (forward_id != forwards_)
      throw Error(fmt::format(
          "parm.torch.MoE: backward of forward {} but the layer has run forward {} since; "
          "the layer keeps the state of its last forward only, so call backward before the "
          "next forward with the same number of tokens",
          forward_id, forwards_));
    const Tensor dv = view(dout, kLayerOp, "the output gradient", device(), tokens_shape());
    const Tensor dxv = view(dx, kLayerOp, "the input gradient", device(), tokens_shape());
    py::gil_scoped_release nogil;
    layer_->zero_grad();
    layer_->backward_into(dv, dl_aux, dxv);
  }
  int64_t forwards() const { return forwards_; }
  // The bus bytes the step list says one pass moves per "group.op" (schedule::collective_parts:
  // what the communicators count, docs/spec.md's table under a capacity factor).
  std::map<std::string, double> listed_bytes(bool backward) const {
    std::map<std::string, double> out;
    for (const auto& step : layer_->schedule().steps)
      for (const auto& part :
           schedule::collective_parts(layer_->schedule(), step, topo_->layout(), backward))
        out[std::string(group_name(part.group)) + "." + comm_op_name(part.op)] += part.bus_bytes;
    return out;
  }

 private:
  Device device() const { return layer_->device(); }
  Shape tokens_shape() const { return {layer_->shape().tokens, layer_->shape().model_dim}; }
  // Points p at the tensors after checking all of them (p is left as it was when one is
  // refused): each a capsule where the layer has the tensor and None where it does not (p
  // keeps its empty one). prefix: "" or "gradient of ", for the messages.
  void point(MoeLayerParams& p, const std::string& prefix,
             const std::vector<py::object>& tensors) const {
    static constexpr const char* kNames[] = {"wg",  "w1",  "b1",  "w2",  "b2",  "w3",
                                             "sw1", "sb1", "sw2", "sb2", "sw3", "swg"};
    MoeLayerParams n = p;
    std::vector<Tensor*> now = {&n.wg};
    for (Tensor* t : n.experts.all()) now.push_back(t);
    for (Tensor* t : n.shared.all()) now.push_back(t);
    now.push_back(&n.shared_gate);
    if (tensors.size() != now.size())
      throw InvalidConfig(fmt::format("{}: {} tensors given, the layer takes {}", kLayerOp,
                                      tensors.size(), now.size()));
    for (size_t i = 0; i < now.size(); ++i) {
      const std::string name = prefix + kNames[i];
      const bool has = !now[i]->empty();
      if (tensors[i].is_none() != !has)
        throw InvalidConfig(fmt::format("{}: {} {} for this layer ({})", kLayerOp, name,
                                        has ? "is missing" : "is not expected",
                                        layer_->shape().str()));
      if (has)
        *now[i] = view(tensors[i].cast<py::capsule>(), kLayerOp, name.c_str(), device(),
                       now[i]->shape());
    }
    p = n;
  }

  std::shared_ptr<Topology> topo_;
  std::unique_ptr<MoeLayer> layer_;
  int64_t forwards_ = 0;
};

// The whole parameters of seed `seed` (as check-layer and the trainer draw them) into
// caller buffers of the whole shapes.
// The layer's tensors (those of ref::MoeParams::named() that its shape has: `kinds` names
// the experts' kind and the shared experts): `whole` maps each name to a capsule of its whole
// shape (ref::param_shape).
void init_params(int64_t model_dim, int64_t hidden, int64_t experts, uint64_t seed,
                 const KindArgs& kinds, const std::map<std::string, py::capsule>& whole) {
  const MoeShape shape = layer_shape(1, model_dim, hidden, experts, 1, "1", kinds);
  const auto p = ref::init_params<float>(shape, seed);
  size_t used = 0;
  for (const auto& [name, src] : p.named()) {
    if (src->empty()) continue;  // not a tensor of this layer
    const auto it = whole.find(name);
    if (it == whole.end())
      throw InvalidConfig(fmt::format("{}: init_params without {} for {}", kLayerOp, name,
                                      shape.str()));
    Tensor dst = view(it->second, kLayerOp, name, Device::kCpu, ref::param_shape(shape, name));
    std::copy(src->begin(), src->end(), dst.data());
    ++used;
  }
  if (used != whole.size())
    throw InvalidConfig(fmt::format("{}: init_params given {} tensors, {} has {}", kLayerOp,
                                    whole.size(), shape.str(), used));
}

// This rank's expert shards of a layer of these sizes on the current topology, after Parm's
// checks of the sizes and of the layout (schedule::validate, with the Python argument names):
// the experts [first_expert, first_expert + local_experts) and hidden columns
// [hidden_first, hidden_first + shard_hidden) of each, and adds_b2, whether this rank's
// shard adds b2 (its gradient is then this rank's to report; schedule::build's rule).
py::dict expert_shards(int64_t model_dim, int64_t hidden, int64_t experts, int topk,
                       const std::string& capacity_factor, const KindArgs& router) {
  Topology& topo = topology(kLayerOp);
  const Layout& l = topo.layout();
  const std::string call =
      fmt::format("{}(model_dim={}, hidden={}, experts={}, topk={}, capacity_factor='{}')",
                  kLayerOp, model_dim, hidden, experts, topk, capacity_factor);
  schedule::LayerSpec spec;
  spec.layout = l;
  spec.esp_rank = topo.comm(Group::kEsp).rank();
  try {
    spec.shape = layer_shape(l.mp, model_dim, hidden, experts, topk, capacity_factor, router);
    spec.shape.validate();
  } catch (const InvalidConfig& e) {
    throw InvalidConfig(fmt::format("{}: {}", call, e.what()));
  }
  // S2 is defined on every layout, and T = N_MP tokens divide over the MP group: what is
  // checked here is the experts' split over the layout; the schedule, per token count.
  const schedule::Kind kind = schedule::Kind::kS2;
  try {
    schedule::validate(spec, kind, {"experts", "hidden", "tokens"});
  } catch (const InvalidConfig& e) {
    throw InvalidConfig(fmt::format(
        "{} does not fit parm.init's layout mp {} ep {} esp {}, which needs experts a "
        "multiple of ep and hidden a multiple of esp: {}",
        call, l.mp, l.ep, l.esp, e.what()));
  }
  const schedule::Schedule s = schedule::build(spec, kind);
  const int64_t local = experts / l.ep, shard = hidden / l.esp;
  return py::dict(py::arg("local_experts") = local,
                  py::arg("first_expert") = topo.comm(Group::kEp).rank() * local,
                  py::arg("shard_hidden") = shard,
                  py::arg("hidden_first") = spec.esp_rank * shard,
                  py::arg("adds_b2") = s.adds_b2,
                  py::arg("mp_rank") = topo.comm(Group::kMp).rank(),
                  py::arg("dp_rank") = topo.comm(Group::kDp).rank(),
                  py::arg("shared_shard_hidden") = spec.shape.shared_hidden / l.mp);
}

// The cost model's pick among `kinds` x `fuse_modes` for this shape on the current topology
// (what `bench-layer --schedule auto` runs): (schedule name, fused).
std::pair<std::string, bool> choose_schedule(int64_t tokens, int64_t model_dim, int64_t hidden,
                                             int64_t experts, int topk,
                                             const std::string& capacity_factor,
                                             const KindArgs& router,
                                             const std::string& profile_path,
                                             const std::vector<std::string>& kinds,
                                             const std::vector<bool>& fuse_modes) {
  Topology& topo = topology("parm.torch.MoE");
  const MoeShape shape =
      layer_shape(tokens, model_dim, hidden, experts, topk, capacity_factor, router);
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
      comm_failed() = true;
      timeout_error(e.what());
    } catch (const CommError& e) {
      comm_failed() = true;
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const InvalidConfig& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  m.def("init", &init, py::arg("mp"), py::arg("ep"), py::arg("esp"), py::arg("pp"),
        py::arg("order"), py::arg("ranks_per_node"), py::arg("device"), py::arg("timeout"));
  m.def("init_torch", &init_torch, py::arg("world"), py::arg("mp"), py::arg("ep"),
        py::arg("esp"), py::arg("pp"), py::arg("order"), py::arg("timeout"),
        py::arg("world_rank"), py::arg("node_of_rank"), py::arg("groups"),
        py::arg("device") = "cpu");
  // This rank's counters since the last reset: "group.op" -> (calls, bus bytes, time in
  // microseconds from issue to completion), the ops with a call.
  m.def("comm_stats", [] {
    Topology& t = topology("parm._core.comm_stats()");
    std::map<std::string, std::tuple<int64_t, double, double>> out;
    for (int gi = 0; gi < kNumGroups; ++gi) {
      const Group g = static_cast<Group>(gi);
      for (int oi = 0; oi < kNumCommOps; ++oi) {
        const OpStats& st = t.host_comm(g).stats().op(static_cast<CommOp>(oi));
        if (st.calls > 0)
          out[std::string(group_name(g)) + "." + comm_op_name(static_cast<CommOp>(oi))] = {
              st.calls, st.bus_bytes, st.time_us};
      }
    }
    return out;
  });
  m.def("reset_comm_stats", [] { topology("parm._core.reset_comm_stats()").reset_stats(); });
  m.def("check_device_name", [](const std::string& d) { (void)parse_device(d); });
  m.def("comm_backend",
        [] { return std::string(topology("parm.backend()").comm_backend()); });
  m.def("finalize", &finalize, py::arg("abort") = false);
  m.def("initialized", [] { return current_topology() != nullptr; });
  m.def("rank", [] { return topology("parm.rank()").world_rank(); });
  m.def("world_size", [] { return topology("parm.world_size()").layout().world; });
  m.attr("DEFAULT_ORDER") = kDefaultOrder;
  m.def("layout", [] {
    const Layout& l = topology("parm.layout()").layout();
    return py::dict(py::arg("world") = l.world, py::arg("mp") = l.mp, py::arg("ep") = l.ep,
                    py::arg("esp") = l.esp, py::arg("dp") = l.dp, py::arg("edp") = l.edp,
                    py::arg("pp") = l.pp, py::arg("order") = l.order_name());
  });
  m.def("group_ranks", [](const std::string& group) {
    Topology& t = topology("parm.group_ranks()");
    return group_members(t.layout(), parse_group(group), t.world_rank());
  });
  // The members of every world rank's group `group` in the layout of these values (the
  // torch backend's check of the caller's groups): [group_members(r) for r in the world].
  m.def("layout_members", [](int world, int mp, int ep, int esp, int pp,
                             const std::string& order, const std::string& group) {
    const Layout l = make_layout(world, mp, ep, esp, pp, order);
    const Group g = parse_group(group);
    std::vector<std::vector<int>> all;
    for (int r = 0; r < world; ++r) all.push_back(group_members(l, g, r));
    return all;
  });
  m.def("group_rank", [](const std::string& group) {
    Topology& t = topology("parm.group_rank()");
    return group_coord(t.layout(), parse_group(group), t.world_rank()).rank;
  });
  m.def("device", [] { return std::string(device_name(topology("parm.device()").device())); });
  // Sum of a float32 CPU tensor over this rank's group `group`, in place.
  m.def("allreduce_sum", [](const py::capsule& t, const std::string& group) {
    Communicator& c = topology("parm.allreduce_sum()").host_comm(parse_group(group));
    Tensor v = view(t, "parm.allreduce_sum", "the tensor", Device::kCpu);
    py::gil_scoped_release nogil;
    c.allreduce(v.data(), static_cast<size_t>(v.numel()));
  }, py::arg("tensor"), py::arg("group") = "world");
  // A float32 tensor of `shape` on the layer's device whose memory Parm owns (tensor_pool.h),
  // as a DLPack capsule for torch.utils.dlpack.from_dlpack.
  m.def("empty", [](const std::vector<int64_t>& shape) {
    return py_dlpack::take(shape, topology("parm._core.empty()").device());
  });
  m.def("pooled", &py_dlpack::pooled);
  // Threads of the CPU GEMMs (for every thread of the process; OpenMP's count of the thread
  // that calls them is set to it, which torch's intra-op count in that thread is too).
  m.def("set_gemm_threads", &cpu::set_gemm_threads);
  // CUDA builds: the GPU of this rank and its compute stream (for t.__dlpack__(stream=)).
  m.def("cuda_device", &py_dlpack::cuda_ordinal);
  m.def("cuda_stream", &py_dlpack::cuda_stream);
  // Tests: throws Parm's error of `kind` ("config", "error") with `message`, to check the
  // translation into Python exceptions (a Timeout comes from a real stuck collective:
  // tests/python/stuck_collective.py).
  m.def("_throw_for_test", [](const std::string& kind, const std::string& message) {
    if (kind == "config") throw InvalidConfig(message);
    throw Error(message);
  });
  m.def("init_params", &init_params);
  m.def("expert_shards", &expert_shards, py::arg("model_dim"), py::arg("hidden"),
        py::arg("experts"), py::arg("topk"), py::arg("capacity_factor"), py::arg("router"));
  m.def("choose_schedule", &choose_schedule);

  py::class_<PyLayer>(m, "Layer")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, int, const std::string&,
                    const KindArgs&, const std::string&, bool, const std::string&>())
      .def("shard_info", &PyLayer::shard_info)
      .def("schedule_name", &PyLayer::schedule_name)
      .def("set_params", &PyLayer::set_params)
      .def("set_grads", &PyLayer::set_grads)
      .def("forward", &PyLayer::forward)
      .def("backward", &PyLayer::backward)
      .def("forwards", &PyLayer::forwards)
      .def("listed_bytes", &PyLayer::listed_bytes, py::arg("backward"));
}
