// `parm bench-comm`: every collective on every group over a range of sizes, as nccl-tests
// rows: bytes, time (median and max over iterations of the max over ranks), algbw, busbw.
// Every (group, op, size) is also checked once with payloads that encode their source rank.
// The fused collectives (docs/spec.md §4) run beside their unfused pairs on group "ep+esp", and
// are checked bit for bit against them.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli_common.h"
#include "comm/fused.h"
#include "comm/fused_plan.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "parm/timer.h"

namespace parm::cli {
namespace {

struct BenchCommFlags {
  LayoutFlags layout;
  std::vector<std::string> groups = {"world", "mp", "ep", "esp", "dp", "edp"};
  // Default: the plain collectives, and the fused/unfused pairs when ep and esp both have
  // more than one rank.
  std::vector<std::string> ops = {"allreduce", "allgather", "reduce_scatter", "alltoall"};
  bool ops_given = false;  // --ops on the command line
  int chunks = fused_plan::kDefaultChunks;  // pipeline pieces of the fused collectives
  int64_t min_bytes = 1024;
  int64_t max_bytes = 16 << 20;
  int64_t factor = 4;
  int iters = 20;
  int warmup = 3;
  std::string json;
};

// The fused collectives and the unfused pairs they replace (group "ep+esp").
enum class PairOp { kFusedDispatch, kUnfusedDispatch, kFusedCombine, kUnfusedCombine };
constexpr PairOp kPairOps[] = {PairOp::kFusedDispatch, PairOp::kUnfusedDispatch,
                               PairOp::kFusedCombine, PairOp::kUnfusedCombine};

const char* pair_op_name(PairOp op) {
  switch (op) {
    case PairOp::kFusedDispatch: return "fused_dispatch";
    case PairOp::kUnfusedDispatch: return "unfused_dispatch";
    case PairOp::kFusedCombine: return "fused_combine";
    case PairOp::kUnfusedCombine: return "unfused_combine";
  }
  return "?";
}

bool is_dispatch(PairOp op) {
  return op == PairOp::kFusedDispatch || op == PairOp::kUnfusedDispatch;
}

// Splits --ops into plain collectives and fused/unfused pairs.
void parse_ops(const std::vector<std::string>& names, std::vector<CommOp>& plain,
               std::vector<PairOp>& pairs) {
  for (const auto& s : names) {
    bool found = false;
    for (CommOp op : {CommOp::kAllReduce, CommOp::kAllGather, CommOp::kReduceScatter,
                      CommOp::kAllToAll})
      if (s == comm_op_name(op)) plain.push_back(op), found = true;
    for (PairOp op : kPairOps)
      if (s == pair_op_name(op)) pairs.push_back(op), found = true;
    if (!found)
      throw InvalidConfig(fmt::format(
          "unknown op '{}'; valid ops: allreduce, allgather, reduce_scatter, alltoall, "
          "fused_dispatch, unfused_dispatch, fused_combine, unfused_combine",
          s));
  }
}

// One call of `op` on buffers of `bytes` per rank (nccl-tests sizes: the allreduce buffer,
// the allgather output, the reduce_scatter input, the alltoall send buffer).
struct Buffers {
  std::vector<float> send, recv;
};

size_t chunk_count(CommOp op, int n, int64_t bytes) {
  const size_t elems = static_cast<size_t>(bytes) / sizeof(float);
  return op == CommOp::kAllReduce ? elems : elems / static_cast<size_t>(n);
}

void run_op(Communicator& c, CommOp op, size_t count, Buffers& b) {
  switch (op) {
    case CommOp::kAllReduce: c.allreduce(b.recv.data(), count); break;
    case CommOp::kAllGather: c.allgather(b.send.data(), b.recv.data(), count); break;
    case CommOp::kReduceScatter: c.reduce_scatter(b.send.data(), b.recv.data(), count); break;
    case CommOp::kAllToAll: c.alltoall(b.send.data(), b.recv.data(), count); break;
    default: PARM_CHECK(false, "op {} not benchmarked", comm_op_name(op));
  }
}

// Fills the payload so every received element names its source rank, runs once, checks.
bool check_op(Communicator& c, CommOp op, size_t count, Buffers& b) {
  const int n = c.size(), me = c.rank();
  auto val = [](int src, int dst, size_t i) {
    return static_cast<float>(src * 1000 + dst * 100 + static_cast<int>(i % 97));
  };
  const size_t send_n = op == CommOp::kAllGather ? count : count * static_cast<size_t>(n);
  if (op == CommOp::kAllReduce) {
    for (size_t i = 0; i < count; ++i) b.recv[i] = val(me, 0, i);
  } else {
    for (size_t i = 0; i < send_n; ++i)
      b.send[i] = val(me, op == CommOp::kAllGather ? 0 : static_cast<int>(i / count), i % count);
  }
  run_op(c, op, count, b);
  bool ok = true;
  for (size_t i = 0; i < count && ok; ++i) {
    switch (op) {
      case CommOp::kAllReduce: {
        float want = 0.0f;
        for (int p = 0; p < n; ++p) want += val(p, 0, i);
        ok = b.recv[i] == want;
        break;
      }
      case CommOp::kReduceScatter: {
        float want = 0.0f;
        for (int p = 0; p < n; ++p) want += val(p, me, i);
        ok = b.recv[i] == want;
        break;
      }
      case CommOp::kAllGather:
      case CommOp::kAllToAll:
        for (int p = 0; p < n && ok; ++p)
          ok = b.recv[static_cast<size_t>(p) * count + i] ==
               val(p, op == CommOp::kAllGather ? 0 : me, i);
        break;
      default: break;
    }
  }
  return ok;
}

// Buffers of one fused/unfused pair at one size. `block` = elements per EP peer; the input
// per rank is (N_EP, block) for the dispatch and (N_ESP, N_EP, block) for the combine.
struct PairBuffers {
  size_t block = 0;
  std::vector<float> in, out, mid;  // mid: the unfused pair's intermediate (N_EP, block)
};

PairBuffers pair_buffers(PairOp op, int n_ep, int n_esp, int64_t bytes) {
  const size_t elems = static_cast<size_t>(bytes) / sizeof(float);
  const size_t ep = static_cast<size_t>(n_ep), esp = static_cast<size_t>(n_esp);
  PairBuffers b;
  b.block = is_dispatch(op) ? elems / ep : elems / (ep * esp);
  const size_t row = ep * b.block;
  b.in.resize(is_dispatch(op) ? row : esp * row);
  b.out.resize(is_dispatch(op) ? esp * row : row);
  b.mid.resize(row);
  return b;
}

const fused_plan::Description& pipeline_of(PairOp op) {
  return fused_plan::describe(is_dispatch(op) ? fused_plan::Pipeline::kDispatch
                                              : fused_plan::Pipeline::kCombine);
}

Communicator& comm_of(const fused_plan::Stage& st, Communicator& ep, Communicator& esp) {
  return st.group == fused_plan::Role::kEp ? ep : esp;
}

// The unfused pair runs the pipeline's two stages one after the other: in -> mid -> out.
void run_pair(PairOp op, Communicator& ep, Communicator& esp, int chunks, PairBuffers& b) {
  switch (op) {
    case PairOp::kFusedDispatch:
      fused_dispatch(ep, esp, b.in.data(), b.out.data(), b.block, chunks);
      break;
    case PairOp::kFusedCombine:
      fused_combine(esp, ep, b.in.data(), b.out.data(), b.block, chunks);
      break;
    case PairOp::kUnfusedDispatch:
    case PairOp::kUnfusedCombine: {
      const fused_plan::Description& d = pipeline_of(op);
      PARM_CHECK(d.num_stages == 2, "bench-comm runs the two stages of {}, not {}", d.name,
                 d.num_stages);
      const fused_plan::Stage &first = d.stages[0], &second = d.stages[1];
      fused_plan::run_unfused_stage(first, comm_of(first, ep, esp), b.in.data(), b.mid.data(),
                                    ep.size(), b.block);
      fused_plan::run_unfused_stage(second, comm_of(second, ep, esp), b.mid.data(), b.out.data(),
                                    ep.size(), b.block);
      break;
    }
  }
}

// Bus bytes this rank receives in one call: the sum of the parts' (comm.h convention).
double pair_bus_bytes(PairOp op, int n_ep, int n_esp, size_t block) {
  const fused_plan::Description& d = pipeline_of(op);
  double sum = 0.0;
  for (int j = 0; j < d.num_stages; ++j) {
    const fused_plan::Stage& st = d.stages[static_cast<size_t>(j)];
    sum += fused_plan::stage_bus_bytes(st, st.group == fused_plan::Role::kEp ? n_ep : n_esp, n_ep,
                                       block);
  }
  return sum;
}

// Fused == unfused bit for bit on every rank, on floats of mixed magnitude and sign that
// differ per rank (so the combine's summation order matters).
bool check_pair(PairOp op, Communicator& ep, Communicator& esp, int chunks, int world_rank,
                PairBuffers& b) {
  for (size_t i = 0; i < b.in.size(); ++i) {
    const uint32_t h = static_cast<uint32_t>((i * 2654435761u) ^ (world_rank * 40503u));
    b.in[i] = std::ldexp(static_cast<float>(h % 100003) - 50001.0f, static_cast<int>(h % 17) - 8) +
              static_cast<float>(world_rank) * 1e-3f;
  }
  const bool dispatch = is_dispatch(op);
  run_pair(dispatch ? PairOp::kUnfusedDispatch : PairOp::kUnfusedCombine, ep, esp, chunks, b);
  const std::vector<float> unfused = b.out;
  std::fill(b.out.begin(), b.out.end(), -1.0f);
  run_pair(dispatch ? PairOp::kFusedDispatch : PairOp::kFusedCombine, ep, esp, chunks, b);
  return unfused.empty() ||
         std::memcmp(unfused.data(), b.out.data(), unfused.size() * sizeof(float)) == 0;
}

int run_bench_comm(const BenchCommFlags& f) {
  PARM_CONFIG_CHECK(f.min_bytes >= 0 && f.max_bytes >= f.min_bytes,
                    "--min-bytes {} and --max-bytes {} must satisfy 0 <= min <= max",
                    f.min_bytes, f.max_bytes);
  PARM_CONFIG_CHECK(f.factor >= 2, "--step-factor {} must be at least 2", f.factor);
  PARM_CONFIG_CHECK(f.iters >= 1, "--iters {} must be at least 1", f.iters);
  PARM_CONFIG_CHECK(f.chunks >= 1, "--chunks {} must be at least 1 (1 = no pipelining)",
                    f.chunks);
  std::vector<Group> groups;
  for (const auto& g : f.groups) groups.push_back(parse_group(g));
  std::vector<CommOp> ops;
  std::vector<PairOp> pair_ops;
  parse_ops(f.ops, ops, pair_ops);
  if (!f.ops_given) pair_ops.assign(std::begin(kPairOps), std::end(kPairOps));
  auto topo = Topology::create(f.layout.topology());
  const bool root = topo->world_rank() == 0;
  Communicator& world = topo->comm(Group::kWorld);
  Communicator& ep = topo->comm(Group::kEp);
  Communicator& esp = topo->comm(Group::kEsp);
  const bool skip_pairs = !pair_ops.empty() && (ep.size() < 2 || esp.size() < 2);
  if (skip_pairs) pair_ops.clear();

  if (root) {
    std::printf("# parm bench-comm: %d ranks, %d node(s), %d iters (+%d warmup); times are the "
                "max over ranks of each iteration\n",
                topo->layout().world, topo->num_nodes(), f.iters, f.warmup);
    if (skip_pairs)
      std::printf("# note: fused/unfused dispatch and combine skipped: they need ep > 1 and "
                  "esp > 1 (here ep = %d, esp = %d)\n",
                  ep.size(), esp.size());
    std::printf("%-6s %-6s %-15s %12s %10s %11s %11s %9s %9s %5s\n", "group", "size", "op",
                "bytes", "count", "p50_us", "max_us", "algbw", "busbw", "check");
  }
  nlohmann::json rows = nlohmann::json::array();
  int failures = 0;
  for (Group g : groups) {
    Communicator& c = topo->comm(g);
    const int n = c.size();
    if (n <= 1) continue;
    for (CommOp op : ops) {
      for (int64_t bytes = f.min_bytes; bytes <= f.max_bytes;
           bytes = bytes == 0 ? 1 : bytes * f.factor) {
        const size_t count = chunk_count(op, n, bytes);
        const size_t total = op == CommOp::kAllReduce ? count : count * static_cast<size_t>(n);
        Buffers b{std::vector<float>(total), std::vector<float>(total)};
        std::vector<double> times;
        for (int it = 0; it < f.warmup + f.iters; ++it) {
          world.barrier();
          const double t0 = now_us();
          run_op(c, op, count, b);
          if (it >= f.warmup) times.push_back(now_us() - t0);
        }
        times = max_over_ranks(topo->host_comm(Group::kWorld), times);
        int ok = check_op(c, op, count, b) ? 1 : 0;
        world.allreduce(&ok, 1, DType::kI32);
        const bool all_ok = ok == topo->layout().world;
        failures += all_ok ? 0 : 1;
        const double p50 = median(times);
        const double mx = *std::max_element(times.begin(), times.end());
        const double real_bytes = static_cast<double>(total * sizeof(float));
        const double algbw = p50 > 0 ? real_bytes / (p50 * 1e3) : 0.0;  // GB/s
        const double busbw = p50 > 0 ? bus_bytes(op, n, op == CommOp::kAllReduce
                                                            ? real_bytes
                                                            : real_bytes / n) /
                                           (p50 * 1e3)
                                     : 0.0;
        if (root) {
          std::printf("%-6s %-6d %-15s %12.0f %10zu %11.1f %11.1f %9.3f %9.3f %5s\n",
                      group_name(g), n, comm_op_name(op), real_bytes, count, p50, mx, algbw, busbw,
                      all_ok ? "ok" : "FAIL");
          rows.push_back({{"group", group_name(g)}, {"group_size", n},
                          {"intra_node", c.intra_node()}, {"op", comm_op_name(op)},
                          {"bytes", real_bytes}, {"count", count}, {"time_us_p50", p50},
                          {"time_us_max", mx}, {"algbw_gbps", algbw}, {"busbw_gbps", busbw},
                          {"check", all_ok}});
        }
        if (bytes == f.max_bytes) break;
      }
    }
  }
  // The fused collectives beside their unfused pairs: bytes = the input per rank.
  const int n_ep = ep.size(), n_esp = esp.size();
  const std::string pair_size = fmt::format("{}x{}", n_ep, n_esp);
  for (PairOp op : pair_ops) {
    for (int64_t bytes = f.min_bytes; bytes <= f.max_bytes;
         bytes = bytes == 0 ? 1 : bytes * f.factor) {
      PairBuffers b = pair_buffers(op, n_ep, n_esp, bytes);
      std::vector<double> times;
      for (int it = 0; it < f.warmup + f.iters; ++it) {
        world.barrier();
        const double t0 = now_us();
        run_pair(op, ep, esp, f.chunks, b);
        if (it >= f.warmup) times.push_back(now_us() - t0);
      }
      times = max_over_ranks(topo->host_comm(Group::kWorld), times);
      int ok = check_pair(op, ep, esp, f.chunks, topo->world_rank(), b) ? 1 : 0;
      world.allreduce(&ok, 1, DType::kI32);
      const bool all_ok = ok == topo->layout().world;
      failures += all_ok ? 0 : 1;
      const double p50 = median(times);
      const double mx = *std::max_element(times.begin(), times.end());
      const double real_bytes = static_cast<double>(b.in.size() * sizeof(float));
      const double algbw = p50 > 0 ? real_bytes / (p50 * 1e3) : 0.0;  // GB/s
      const double busbw =
          p50 > 0 ? pair_bus_bytes(op, n_ep, n_esp, b.block) / (p50 * 1e3) : 0.0;
      const bool fused = op == PairOp::kFusedDispatch || op == PairOp::kFusedCombine;
      if (root) {
        std::printf("%-6s %-6s %-15s %12.0f %10zu %11.1f %11.1f %9.3f %9.3f %5s\n", "ep+esp",
                    pair_size.c_str(), pair_op_name(op), real_bytes, b.block, p50, mx, algbw,
                    busbw, all_ok ? "ok" : "FAIL");
        rows.push_back({{"group", "ep+esp"}, {"group_size", n_ep * n_esp}, {"ep_size", n_ep},
                        {"esp_size", n_esp},
                        {"intra_node", ep.intra_node() && esp.intra_node()},
                        {"op", pair_op_name(op)}, {"bytes", real_bytes}, {"count", b.block},
                        {"chunks", fused ? f.chunks : 1}, {"time_us_p50", p50},
                        {"time_us_max", mx}, {"algbw_gbps", algbw}, {"busbw_gbps", busbw},
                        {"check", all_ok}});
      }
      if (bytes == f.max_bytes) break;
    }
  }
  if (root) {
    std::printf("# GB/s = 1e9 bytes/s; busbw = algbw x (n-1)/n (allreduce: 2(n-1)/n)\n");
    if (!pair_ops.empty())
      std::printf("# ep+esp rows: size = N_EP x N_ESP; bytes = input per rank; count = block "
                  "(elements per EP peer); busbw = the parts' bus bytes / time; fused ops use "
                  "%d chunks; check = fused equals unfused bit for bit\n",
                  f.chunks);
    if (!f.json.empty()) {
      nlohmann::json doc = {{"world", topo->layout().world}, {"nodes", topo->num_nodes()},
                            {"iters", f.iters}, {"rows", rows}};
      write_file_atomic(f.json, doc.dump(2) + "\n");
    }
    if (failures) std::fprintf(stderr, "parm bench-comm: %d check(s) failed\n", failures);
  }
  return failures ? 1 : 0;
}

}  // namespace

Command add_bench_comm(CLI::App& root) {
  auto* app = root.add_subcommand("bench-comm", "time every collective on every group");
  auto f = std::make_shared<BenchCommFlags>();
  f->layout.add_to(app);
  app->add_option("--groups", f->groups, "groups to measure")->delimiter(',');
  CLI::Option* ops = app->add_option(
      "--ops", f->ops,
      "collectives to measure: allreduce, allgather, reduce_scatter, alltoall, fused_dispatch, "
      "unfused_dispatch, fused_combine, unfused_combine (default: the first four, plus the "
      "last four when ep > 1 and esp > 1)");
  ops->delimiter(',');
  app->add_option("--chunks", f->chunks, "pipeline pieces of the fused collectives");
  app->add_option("--min-bytes", f->min_bytes, "smallest buffer per rank");
  app->add_option("--max-bytes", f->max_bytes, "largest buffer per rank");
  app->add_option("--step-factor", f->factor, "size multiplier between rows");
  app->add_option("--iters", f->iters, "timed iterations per row");
  app->add_option("--warmup", f->warmup, "untimed iterations per row");
  app->add_option("--json", f->json, "also write the rows to this JSON file");
  return {app, [f, ops] {
            f->ops_given = ops->count() > 0;
            return run_bench_comm(*f);
          }};
}

}  // namespace parm::cli
