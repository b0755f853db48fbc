#include "perfmodel/profile.h"

#include <cmath>

#include "parm/error.h"
#include "parm/fileio.h"
#include "perfmodel/json_reader.h"

namespace parm::perfmodel {

const char* link_name(Link link) { return link == Link::kIntra ? "intra" : "inter"; }

int model_op_index(CommOp op) {
  for (size_t i = 0; i < kModelOps.size(); ++i)
    if (kModelOps[i] == op) return static_cast<int>(i);
  throw Error(fmt::format("the cost model does not price '{}'", comm_op_name(op)));
}

const char* gemm_class_name(GemmClass c) {
  switch (c) {
    case GemmClass::kExpertNN: return "expert_nn";
    case GemmClass::kExpertTN: return "expert_tn";
    case GemmClass::kExpertNT: return "expert_nt";
    case GemmClass::kGate: return "gate";
  }
  return "?";
}

const char* mem_class_name(MemClass c) { return c == MemClass::kCopy ? "copy" : "gelu"; }

namespace {

// GEMM and memory fits share one JSON shape: {"alpha_us", <rate key>, "r2", "samples",
// "source"} per class; `rate` names the field that holds the rate (GFLOP/s or GB/s).
template <typename Fit, size_t N, typename Class>
void write_rate_fits(const std::array<Fit, N>& fits, const char* rate_key, double Fit::*rate,
                     const char* (*class_name)(Class), nlohmann::json& out) {
  for (size_t c = 0; c < N; ++c) {
    const Fit& f = fits[c];
    out[class_name(static_cast<Class>(c))] = {{"alpha_us", f.alpha_us}, {rate_key, f.*rate},
                                              {"r2", f.r2}, {"samples", f.samples},
                                              {"source", f.source}};
  }
}

template <typename Fit, size_t N, typename Class>
void read_rate_fits(JsonReader& r, const nlohmann::json& j, const char* section,
                    const char* rate_key, double Fit::*rate, const char* (*class_name)(Class),
                    std::array<Fit, N>& fits) {
  const auto& sec = r.object(j, "", section);
  for (size_t c = 0; c < N; ++c) {
    const std::string cname = class_name(static_cast<Class>(c));
    const auto& e = r.object(sec, section, cname);
    const std::string path = std::string(section) + "." + cname;
    Fit& f = fits[c];
    f.alpha_us = r.number(e, path, "alpha_us", 0.0, true);
    f.*rate = r.number(e, path, rate_key, 0.0, false);
    f.r2 = r.number(e, path, "r2", -INFINITY, true, 1.0);
    f.samples = r.integer(e, path, "samples", 0);
    f.source = r.text(e, path, "source");
  }
}

void read_sync_fit(JsonReader& r, const nlohmann::json& j, const std::string& key, SyncFit& f) {
  const auto& sy = r.object(j, "", key);
  f.us = r.number(sy, key, "us", 0.0, true);
  // Profiles written before the compute term priced a constant rendezvous.
  if (sy.contains("per_compute")) f.per_compute = r.number(sy, key, "per_compute", 0.0, true);
  if (sy.contains("compute_cap_us"))
    f.compute_cap_us = r.number(sy, key, "compute_cap_us", 0.0, true);
  if (sy.contains("r2")) f.r2 = r.number(sy, key, "r2", -INFINITY, true, 1.0);
  f.samples = r.integer(sy, key, "samples", 0);
  f.source = r.text(sy, key, "source");
}

}  // namespace

nlohmann::json profile_to_json(const Profile& p) {
  nlohmann::json j;
  j["version"] = Profile::kVersion;
  j["machine"] = p.machine;
  j["device"] = device_name(p.device);
  for (int l = 0; l < kNumLinks; ++l)
    for (size_t o = 0; o < kModelOps.size(); ++o) {
      const CommFit& f = p.comm[static_cast<size_t>(l)][o];
      j["collectives"][link_name(static_cast<Link>(l))][comm_op_name(kModelOps[o])] = {
          {"alpha_us", f.alpha_us},
          {"alpha_per_rank_us", f.alpha_per_rank_us},
          {"beta_us_per_byte", f.beta_us_per_byte},
          {"r2", f.r2},
          {"samples", f.samples},
          {"group_sizes", f.group_sizes},
          {"source", f.source},
          {"alpha_per_rank_source", f.alpha_per_rank_source},
          {"handshake_us", f.handshake_us},
          {"handshake_source", f.handshake_source}};
    }
  j["fused"] = {{"overlap", p.fused.overlap}, {"per_piece_us", p.fused.per_piece_us},
                {"r2", p.fused.r2},
                {"samples", p.fused.samples}, {"source", p.fused.source},
                {"eager_limit_bytes", p.fused.eager_limit_bytes},
                {"eager_limit_source", p.fused.eager_limit_source},
                {"eager_gain", p.fused.eager_gain},
                {"eager_gain_source", p.fused.eager_gain_source},
                {"eager_gain_mixed", p.fused.eager_gain_mixed},
                {"eager_gain_mixed_source", p.fused.eager_gain_mixed_source}};
  for (const auto& [key, f] : {std::pair{"step_sync", &p.step_sync},
                               std::pair{"step_sync_world", &p.step_sync_world},
                               std::pair{"step_sync_intra", &p.step_sync_intra}})
    j[key] = {{"us", f->us}, {"per_compute", f->per_compute},
              {"compute_cap_us", f->compute_cap_us}, {"r2", f->r2},
              {"samples", f->samples}, {"source", f->source}};
  j["layer_compute"] = {{"scale", p.layer_compute.scale}, {"source", p.layer_compute.source}};
  write_rate_fits(p.gemm, "gflops", &GemmFit::gflops, gemm_class_name, j["gemm"]);
  write_rate_fits(p.mem, "gbps", &MemFit::gbps, mem_class_name, j["memory"]);
  return j;
}

Profile profile_from_json(const nlohmann::json& j, const std::string& origin) {
  JsonReader r("cost profile", origin);
  if (!j.is_object()) r.fail("the top level must be a JSON object");
  if (!j.contains("version"))
    r.fail("missing entry 'version' (this parm reads profile version {}; write one with "
           "`parm calibrate --out FILE`)",
           Profile::kVersion);
  const auto& v = j.at("version");
  if (v.is_number_integer() && v.get<int64_t>() == 1)
    r.fail("'version' is 1: a version 1 profile has one latency per link for every group size "
           "and prices the inter-node link per bus byte of one group, which this parm "
           "(profile version {}) cannot reinterpret; re-run `parm calibrate --out FILE` on the "
           "machine (or cluster) it describes",
           Profile::kVersion);
  if (!v.is_number_integer() || v.get<int64_t>() != Profile::kVersion)
    r.fail("'version' is {}, but this parm reads profile version {} only; re-run `parm "
           "calibrate --out FILE`",
           v.dump(), Profile::kVersion);
  Profile p;
  if (j.contains("machine")) p.machine = r.object(j, "", "machine");
  if (j.contains("device")) {
    const auto& d = j.at("device");
    if (!d.is_string() || (d != "cpu" && d != "cuda"))
      r.fail("'device' is {}; valid: \"cpu\" or \"cuda\" (the device kind calibrate measured)",
             d.dump());
    p.device = parse_device(d.get<std::string>());
  }
  const auto& coll = r.object(j, "", "collectives");
  for (int l = 0; l < kNumLinks; ++l) {
    const std::string lname = link_name(static_cast<Link>(l));
    const auto& link = r.object(coll, "collectives", lname);
    for (size_t o = 0; o < kModelOps.size(); ++o) {
      const std::string oname = comm_op_name(kModelOps[o]);
      const std::string path = "collectives." + lname;
      const auto& e = r.object(link, path, oname);
      const std::string epath = path + "." + oname;
      CommFit& f = p.comm[static_cast<size_t>(l)][o];
      f.alpha_us = r.number(e, epath, "alpha_us", 0.0, true);
      f.alpha_per_rank_us = r.number(e, epath, "alpha_per_rank_us", 0.0, true);
      f.beta_us_per_byte = r.number(e, epath, "beta_us_per_byte", 0.0, true);
      f.r2 = r.number(e, epath, "r2", -INFINITY, true, 1.0);
      f.samples = r.integer(e, epath, "samples", 0);
      const auto& sizes = r.at(e, epath, "group_sizes");
      if (!sizes.is_array())
        r.fail("'{}.group_sizes' must be a JSON list of group sizes, got {}", epath, sizes.dump());
      for (size_t i = 0; i < sizes.size(); ++i)
        f.group_sizes.push_back(static_cast<int>(
            r.integer_value(sizes[i], fmt::format("{}.group_sizes[{}]", epath, i), 2, INT32_MAX)));
      f.source = r.text(e, epath, "source");
      f.alpha_per_rank_source = r.text(e, epath, "alpha_per_rank_source");
      if (e.contains("handshake_us")) {  // older profiles: 0
        f.handshake_us = r.number(e, epath, "handshake_us", 0.0, true);
        f.handshake_source = r.text(e, epath, "handshake_source");
      }
    }
  }
  const auto& fu = r.object(j, "", "fused");
  p.fused.overlap = r.number(fu, "fused", "overlap", kMinOverlap, true, 1.0);
  p.fused.per_piece_us = r.number(fu, "fused", "per_piece_us", 0.0, true);
  p.fused.r2 = r.number(fu, "fused", "r2", -INFINITY, true, 1.0);
  p.fused.samples = r.integer(fu, "fused", "samples", 0);
  p.fused.source = r.text(fu, "fused", "source");
  if (fu.contains("eager_gain")) {  // older profiles: not priced (FusedFit's defaults)
    p.fused.eager_limit_bytes = r.number(fu, "fused", "eager_limit_bytes", 0.0, true);
    p.fused.eager_limit_source = r.text(fu, "fused", "eager_limit_source");
    p.fused.eager_gain = r.number(fu, "fused", "eager_gain", 0.0, true, 1.0);
    p.fused.eager_gain_source = r.text(fu, "fused", "eager_gain_source");
    if (fu.contains("eager_gain_mixed")) {
      p.fused.eager_gain_mixed = r.number(fu, "fused", "eager_gain_mixed", 0.0, true, 1.0);
      p.fused.eager_gain_mixed_source = r.text(fu, "fused", "eager_gain_mixed_source");
    } else {  // profiles of one measured share: it priced every span
      p.fused.eager_gain_mixed = p.fused.eager_gain;
      p.fused.eager_gain_mixed_source = "assumed (copied from eager_gain: not in the profile)";
    }
  }
  read_sync_fit(r, j, "step_sync", p.step_sync);
  if (j.contains("step_sync_intra")) {
    read_sync_fit(r, j, "step_sync_intra", p.step_sync_intra);
  } else {
    p.step_sync_intra = p.step_sync;
    p.step_sync_intra.source = "assumed (copied from step_sync: not in the profile)";
  }
  if (j.contains("step_sync_world")) {
    read_sync_fit(r, j, "step_sync_world", p.step_sync_world);
  } else {  // profiles written before the world was measured apart
    p.step_sync_world = p.step_sync;
    p.step_sync_world.source = "assumed (copied from step_sync: not in the profile)";
  }
  if (j.contains("layer_compute")) {  // older profiles: 1 (ComputeScale's default)
    const auto& lc = r.object(j, "", "layer_compute");
    p.layer_compute.scale =
        r.number(lc, "layer_compute", "scale", kMinComputeScale, true, kMaxComputeScale);
    p.layer_compute.source = r.text(lc, "layer_compute", "source");
  }
  read_rate_fits(r, j, "gemm", "gflops", &GemmFit::gflops, gemm_class_name, p.gemm);
  read_rate_fits(r, j, "memory", "gbps", &MemFit::gbps, mem_class_name, p.mem);
  return p;
}

Profile read_profile(const std::string& path) {
  return profile_from_json(read_json_file("cost profile", path), path);
}

void write_profile(const Profile& p, const std::string& path) {
  write_file_atomic(path, profile_to_json(p).dump(2) + "\n");
}

void check_profile_device(const Profile& p, Device run, const std::string& origin) {
  PARM_CONFIG_CHECK(p.device == run,
                    "cost profile {} was taken on device {}, but this run computes on device {}: "
                    "its rates would price the wrong machine; run `parm calibrate --device {} "
                    "--out FILE` on this machine, or choose the schedule by hand (--schedule "
                    "baseline|s1|s2)",
                    origin, device_name(p.device), device_name(run), device_name(run));
}

}  // namespace parm::perfmodel
