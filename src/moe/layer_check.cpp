#include "moe/layer_check.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <type_traits>

#include "moe/moe_layer.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "parm/npy.h"
#include "parm/rng.h"

namespace parm {
namespace {

constexpr uint64_t kGroupSeedStride = 1000003;
constexpr uint64_t kStreamDout = 100;

template <typename A, typename B>
TensorError compare(const std::string& name, const A* a, const B* b, size_t n) {
  double max_abs = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    max_abs = std::isnan(d) ? INFINITY : std::max(max_abs, d);
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(b[i])));
  }
  return {name, max_abs, max_ref > 0 ? max_abs / max_ref : max_abs, false};
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Whole parameter-shaped tensors, by name, in a fixed order (wg first); those the experts'
// kind does not have (empty: b1 and b2 of swiglu, w3 of gelu) are left out.
template <typename S>
std::vector<std::pair<std::string, const std::vector<S>*>> named(const ref::MoeParams<S>& p) {
  std::vector<std::pair<std::string, const std::vector<S>*>> out;
  for (const auto& [name, t] : p.named())
    if (!t->empty()) out.emplace_back(name, t);
  return out;
}



class Dumper {
 public:
  explicit Dumper(std::string dir) : dir_(std::move(dir)) {
    if (!dir_.empty()) ::mkdir(dir_.c_str(), 0755);
  }
  template <typename S>
  void add(const std::string& file, const S* data, const Shape& shape, const std::string& meaning) {
    if (dir_.empty()) return;
    write_npy(dir_ + "/" + file, data, shape);
    files_.push_back({{"file", file}, {"shape", shape}, {"meaning", meaning},
                      {"dtype", dtype_name<S>()}});
  }
  // What a source's files were computed from (its gate calls); merged by name.
  void add_source(const std::string& name, const nlohmann::json& about) {
    sources_[name] = about;
  }
  void finish(const nlohmann::json& config) {
    if (dir_.empty()) return;
    // Merge with what earlier schedules of the same run wrote; the manifest goes last.
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(read_file(dir_ + "/manifest.json"));
    } catch (...) {
      doc = {{"files", nlohmann::json::array()}};
    }
    doc["config"] = config;
    for (const auto& f : files_) {
      bool seen = false;
      for (const auto& g : doc["files"]) seen = seen || g["file"] == f["file"];
      if (!seen) doc["files"].push_back(f);
    }
    for (const auto& [name, about] : sources_.items()) doc["sources"][name] = about;
    write_file_atomic(dir_ + "/manifest.json", doc.dump(2) + "\n");
  }

 private:
  template <typename S>
  static const char* dtype_name() {
    if constexpr (std::is_same_v<S, float>) return "float32";
    if constexpr (std::is_same_v<S, double>) return "float64";
    if constexpr (std::is_same_v<S, int32_t>) return "int32";
    return "uint8";
  }

  std::string dir_;
  std::vector<nlohmann::json> files_;
  nlohmann::json sources_ = nlohmann::json::object();
};

// MP group g's input as the check feeds it (with o.skew added).
std::vector<float> group_input(const LayerCheckOptions& o, int group) {
  auto x = check_input(o.shape, o.seed, group);
  if (o.skew != 0.0f)
    for (float& v : x) v += o.skew;
  return x;
}

// The whole parameters as the check loads them (o.skew and o.force_ties applied).
ref::MoeParams<float> check_params(const LayerCheckOptions& o) {
  const MoeShape& sh = o.shape;
  auto params = ref::init_params<float>(sh, o.seed);
  const int64_t M = sh.model_dim, E = sh.experts;
  if (o.skew != 0.0f)
    for (int64_t m = 0; m < M; ++m) params.wg[static_cast<size_t>(m * E)] += o.skew / M;
  if (o.force_ties && E >= 2)
    for (int64_t m = 0; m < M; ++m) {
      params.wg[static_cast<size_t>(m * E)] = 0.0f;
      params.wg[static_cast<size_t>(m * E + E - 1)] = 0.0f;
    }
  return params;
}

// Tokens whose k choices the tie rule decided: among their k + 1 largest probabilities (all
// E when k = E) two are equal. probs (T, E).
int64_t tie_decided_tokens(const std::vector<double>& probs, int64_t experts, int topk) {
  const size_t E = static_cast<size_t>(experts);
  const size_t n = std::min(E, static_cast<size_t>(topk) + 1);
  int64_t count = 0;
  std::vector<double> row(E);
  for (size_t t = 0; t < probs.size() / E; ++t) {
    row.assign(probs.begin() + static_cast<std::ptrdiff_t>(t * E),
               probs.begin() + static_cast<std::ptrdiff_t>((t + 1) * E));
    std::partial_sort(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(n), row.end(),
                      std::greater<>());
    bool tie = false;
    for (size_t i = 0; i + 1 < n; ++i) tie = tie || row[i] == row[i + 1];
    count += tie ? 1 : 0;
  }
  return count;
}

// A routing as the dump writes it: expert, slot (-1 when dropped) and kept, each (T, k).
struct DumpRouting {
  std::vector<int32_t> expert, slot;
  std::vector<uint8_t> kept;
  void set_kept() {
    kept.resize(slot.size());
    for (size_t i = 0; i < slot.size(); ++i) kept[i] = slot[i] >= 0 ? 1 : 0;
  }
};

template <typename S>
DumpRouting dump_routing(const ref::Routing<S>& r) {
  DumpRouting d;
  d.expert = r.expert;
  d.slot.assign(r.slot.begin(), r.slot.end());
  d.set_kept();
  return d;
}

// The layer's routing of its MP group's T tokens: under S1 each MP rank gated its slice, so
// the slices are gathered over the MP group (every member calls this); otherwise every
// rank gated all T tokens.
DumpRouting gather_layer_routing(Topology& topo, const moe::GateRouting& r, bool sliced) {
  DumpRouting d;
  std::vector<int32_t> mine(2 * r.expert.size());
  for (size_t i = 0; i < r.expert.size(); ++i) {
    mine[i] = r.expert[i];
    mine[r.expert.size() + i] = static_cast<int32_t>(r.slot(i));
  }
  Communicator& mp = topo.host_comm(Group::kMp);
  const int n = sliced ? mp.size() : 1;
  std::vector<int32_t> all(mine.size() * static_cast<size_t>(n));
  if (sliced)
    mp.allgather(mine.data(), all.data(), mine.size());
  else
    all = mine;
  const size_t per = r.expert.size();
  for (int s = 0; s < n; ++s) {
    const auto* base = all.data() + static_cast<size_t>(s) * mine.size();
    d.expert.insert(d.expert.end(), base, base + per);
    d.slot.insert(d.slot.end(), base + per, base + 2 * per);
  }
  d.set_kept();
  return d;
}

}  // namespace

std::vector<float> check_input(const MoeShape& shape, uint64_t seed, int group) {
  return ref::init_input<float>(shape, seed + kGroupSeedStride * static_cast<uint64_t>(group + 1));
}

std::vector<float> check_dout(const MoeShape& shape, uint64_t seed, int group) {
  Tensor t({shape.tokens, shape.model_dim});
  fill_normal(t, seed + kGroupSeedStride * static_cast<uint64_t>(group + 1), kStreamDout, 0.0f,
              1.0f);
  return std::vector<float>(t.data(), t.data() + t.numel());
}

double default_tolerance(Precision precision) {
  return precision == Precision::kBf16 ? 2e-2 : 2e-4;
}

LayerCheckResult check_layer(Topology& topo, const LayerCheckOptions& o) {
  const MoeShape& sh = o.shape;
  const Layout& l = topo.layout();
  const int group = group_coord(l, Group::kMp, topo.world_rank()).index;
  const int mp_rank = topo.comm(Group::kMp).rank();
  const int64_t T = sh.tokens, M = sh.model_dim;
  Communicator& world = topo.host_comm(Group::kWorld);

  // Validates the configuration first.
  MoeLayer layer(topo, sh, o.kind, o.fuse, o.chunks, o.precision, o.dl_z != 0.0f,
                 sh.aux_seq_len > 0 ? AuxScope::kSequence : AuxScope::kMicroBatch);
  const auto params = check_params(o);
  const auto x = group_input(o, group);
  const auto dout = check_dout(sh, o.seed, group);
  ref::MoeParams<double> params64;
  {
    const auto src = params.named();
    const auto dst = params64.named();
    for (size_t i = 0; i < src.size(); ++i) *dst[i].second = to_double(*src[i].second);
  }

  layer.load_whole(params);
  layer.backend().set_weights_version(1);  // one version: a bf16 backend packs them once
  if (!o.router_bias.empty()) layer.router_bias() = o.router_bias;
  const std::vector<double> bias64(o.router_bias.begin(), o.router_bias.end());
  layer.zero_grad();
  Tensor xt = Tensor::view(const_cast<float*>(x.data()), {T, M});
  const Tensor out = layer.forward(xt).to(Device::kCpu);
  const float l_aux = layer.l_aux();
  const float l_z = layer.l_z();
  const Tensor dx = layer.backward(Tensor::view(const_cast<float*>(dout.data()), {T, M}),
                                   o.dl_aux, o.dl_z)
                        .to(Device::kCpu);
  const Tensor dwg = layer.grads().wg.to(Device::kCpu);

  // The gate calls the schedule makes: one per MP slice of gate_tokens rows (S1), or one
  // over all T rows.
  const int64_t gate_tokens = layer.schedule().gate_tokens;
  const int gate_slices = static_cast<int>(T / gate_tokens);
  LayerCheckResult result;
  result.oracle_slices = o.whole_oracle ? 1 : gate_slices;
  const auto fwd = ref::moe_forward<double>(sh, params64, to_double(x),
                                            static_cast<int>(result.oracle_slices),
                                            o.router_bias.empty() ? nullptr : &bias64);
  const auto grads = ref::moe_backward<double>(params64, fwd, to_double(dout), o.dl_aux,
                                                  static_cast<double>(o.dl_z));

  // The layer's routing of its gate rows against the oracle's.
  const auto& r = layer.routing();
  const int64_t first = gate_slices > 1 ? mp_rank * gate_tokens : 0;
  // Slots are numbered per gate call: compare them only when the oracle gated the same rows.
  const bool same_gate_calls = result.oracle_slices == gate_slices;
  bool same = r.tokens == gate_tokens;
  for (int64_t t = 0; same && t < r.tokens; ++t)
    for (int j = 0; j < sh.topk; ++j) {
      const size_t i = static_cast<size_t>(t * sh.topk + j);
      const size_t oi = static_cast<size_t>((first + t) * sh.topk + j);
      const int64_t slot = r.slot(i);
      same = same && r.expert[i] == fwd.routing.expert[oi] &&
             (same_gate_calls ? slot == fwd.routing.slot[oi] : (slot < 0) == (fwd.routing.slot[oi] < 0));
    }

  std::vector<TensorError> errs;
  errs.push_back(compare("out", out.data(), fwd.out.data(), fwd.out.size()));
  errs.push_back(compare("dx", dx.data(), grads.dx.data(), grads.dx.size()));
  const double laux64 = fwd.l_aux;
  errs.push_back({"l_aux", std::fabs(l_aux - laux64),
                  std::fabs(l_aux - laux64) / std::max(1.0, std::fabs(laux64)), false});
  if (o.dl_z != 0.0f)
    errs.push_back({"l_z", std::fabs(l_z - fwd.l_z),
                    std::fabs(l_z - fwd.l_z) / std::max(1.0, std::fabs(fwd.l_z)), false});
  errs.push_back(compare("dwg", dwg.data(), grads.dparams.wg.data(),
                         grads.dparams.wg.size()));

  // Expert gradients, whole: the layer's shards summed over all ranks (b2 once per ESP
  // group; the shared experts' b2 and gate, whole on every MP rank, once per MP group) against
  // the oracle summed over MP groups.
  ref::MoeParams<float> mine = ref::MoeParams<float>::zeros(sh);
  layer.store_whole_grads(mine);
  if (layer.esp_rank() != 0) std::fill(mine.b2.begin(), mine.b2.end(), 0.0f);
  if (mp_rank != 0) {
    std::fill(mine.sb2.begin(), mine.sb2.end(), 0.0f);
    std::fill(mine.swg.begin(), mine.swg.end(), 0.0f);
  }
  const auto mine_named = named(mine);
  const auto oracle_named = named(grads.dparams);
  std::vector<std::vector<double>> layer_whole, oracle_whole;
  for (size_t i = 1; i < mine_named.size(); ++i) {  // skip wg: compared per MP group above
    layer_whole.push_back(to_double(*mine_named[i].second));
    oracle_whole.push_back(mp_rank == 0 ? *oracle_named[i].second
                                        : std::vector<double>(oracle_named[i].second->size()));
    world.allreduce(layer_whole.back().data(), layer_whole.back().size());
    world.allreduce(oracle_whole.back().data(), oracle_whole.back().size());
    errs.push_back(compare("d" + mine_named[i].first, layer_whole.back().data(),
                           oracle_whole.back().data(), layer_whole.back().size()));
  }

  // Max over ranks; routing and drops summed.
  std::vector<double> v;
  for (const auto& e : errs) {
    v.push_back(e.max_abs);
    v.push_back(e.max_rel);
  }
  world.allreduce(v.data(), v.size(), ReduceOp::kMax);
  int32_t ok_routing = same ? 1 : 0;
  world.allreduce(&ok_routing, 1, ReduceOp::kMin);
  int64_t counts[2] = {mp_rank == 0 ? fwd.routing.num_dropped() : 0,
                       mp_rank == 0 ? tie_decided_tokens(fwd.probs, sh.experts, sh.topk) : 0};
  world.allreduce(counts, 2);
  result.routing_matches = ok_routing == 1;
  result.dropped_choices = counts[0];
  result.tie_decided_tokens = counts[1];
  result.passed = result.routing_matches;
  for (size_t i = 0; i < errs.size(); ++i) {
    errs[i].max_abs = v[2 * i];
    errs[i].max_rel = v[2 * i + 1];
    errs[i].passed = errs[i].max_rel <= o.tolerance;
    result.passed = result.passed && errs[i].passed;
  }
  result.errors = std::move(errs);

  result.source =
      std::string(schedule::kind_name(o.kind)) + (layer.schedule().fused ? "_fused" : "");
  result.oracle_source = result.oracle_slices > 1 ? "oracle_sliced" : "oracle";
  if (!o.dump_dir.empty()) {
    // MP group 0's tensors, from world rank 0, plus the whole gradients every rank holds.
    const DumpRouting layer_routing =
        gather_layer_routing(topo, r, gate_slices > 1);
    if (topo.world_rank() == 0) {
      const std::string& sname = result.source;
      const std::string& oname = result.oracle_source;
      Dumper d(o.dump_dir);
      d.add("input.x.npy", x.data(), {T, M}, "input x of MP group 0 (T, M)");
      d.add("input.dout.npy", dout.data(), {T, M}, "output gradient of MP group 0 (T, M)");
      // Every other MP group's input, so that the expert gradients (summed over all groups)
      // can be recomputed from the dump alone.
      for (int g = 1; g < l.world / l.mp; ++g) {
        const auto xg = group_input(o, g);
        const auto dg = check_dout(sh, o.seed, g);
        d.add(fmt::format("input.x.g{}.npy", g), xg.data(), {T, M},
              fmt::format("input x of MP group {} (T, M)", g));
        d.add(fmt::format("input.dout.g{}.npy", g), dg.data(), {T, M},
              fmt::format("output gradient of MP group {} (T, M)", g));
      }
      const int64_t k = sh.topk;
      const std::string slot_meaning =
          "slot of each choice in its expert's capacity, -1 when dropped";
      auto add_routing = [&](const std::string& src, const DumpRouting& dr, int slices) {
        const std::string per =
            slices > 1 ? fmt::format(" (slots per gate call: each MP slice of T / {} tokens has "
                                     "its own capacity C = ceil(k f (T / {}) / E), numbered "
                                     "from 0)", slices, slices)
                       : " (one gate call over T tokens, capacity C = ceil(k f T / E))";
        d.add(src + ".expert.npy", dr.expert.data(), {T, k},
              src + " routing of MP group 0: chosen experts (T, k), choice 0 the largest p");
        d.add(src + ".slot.npy", dr.slot.data(), {T, k},
              src + " routing of MP group 0: " + slot_meaning + per);
        d.add(src + ".kept.npy", dr.kept.data(), {T, k},
              src + " routing of MP group 0: 1 when the choice was kept, 0 when dropped");
        d.add_source(src, {{"gate_slices", slices}});
      };
      add_routing(oname, dump_routing(fwd.routing), static_cast<int>(result.oracle_slices));
      add_routing(sname, layer_routing, gate_slices);
      for (const auto& [name, vec] : named(params))
        d.add("param." + name + ".npy", vec->data(), ref::param_shape(sh, name),
              "whole (unsharded) parameter " + name);
      d.add(oname + ".out.npy", fwd.out.data(), {T, M}, "oracle (fp64) output, MP group 0");
      d.add(oname + ".dx.npy", grads.dx.data(), {T, M}, "oracle (fp64) dx, MP group 0");
      d.add(oname + ".l_aux.npy", &fwd.l_aux, {}, "oracle (fp64) l_aux, MP group 0");
      d.add(oname + ".dwg.npy", grads.dparams.wg.data(), ref::param_shape(sh, "wg"),
            "oracle (fp64) gate-weight gradient, MP group 0");
      d.add(sname + ".out.npy", out.data(), {T, M}, sname + " output, MP group 0");
      d.add(sname + ".dx.npy", dx.data(), {T, M}, sname + " dx, MP group 0");
      d.add(sname + ".l_aux.npy", &l_aux, {}, sname + " l_aux, MP group 0");
      d.add(sname + ".dwg.npy", dwg.data(), ref::param_shape(sh, "wg"),
            sname + " gate-weight gradient, MP group 0");
      for (size_t i = 1; i < mine_named.size(); ++i) {
        const std::string n = mine_named[i].first;
        d.add(oname + ".d" + n + ".npy", oracle_whole[i - 1].data(), ref::param_shape(sh, n),
              "oracle (fp64) gradient of " + n + ", summed over all MP groups");
        d.add(sname + ".d" + n + ".npy", layer_whole[i - 1].data(), ref::param_shape(sh, n),
              sname + " gradient of " + n + ", gathered from the ranks' shards and summed "
              "over EDP replicas");
      }
      d.finish({{"tokens", T}, {"model_dim", M}, {"hidden", sh.hidden},
                {"experts", sh.experts}, {"topk", sh.topk},
                {"expert_mlp", expert_mlp_name(sh.expert_mlp)},
                {"shared_experts", sh.shared_experts}, {"shared_hidden", sh.shared_hidden},
                {"shared_gate", sh.shared_gate},
                {"capacity_factor", sh.capacity_factor.str()}, {"mp", l.mp}, {"ep", l.ep},
                {"esp", l.esp}, {"world", l.world}, {"mp_groups", l.world / l.mp},
                {"seed", o.seed}, {"dl_aux", o.dl_aux}, {"dl_z", o.dl_z}, {"skew", o.skew},
                {"force_ties", o.force_ties}, {"precision", precision_name(o.precision)},
                {"tolerance", o.tolerance}});
    }
    world.barrier();
  }
  return result;
}

}  // namespace parm
