// `parm bench-comm`: every collective on every group over a range of sizes, as nccl-tests
// rows: bytes, time (median and max over iterations of the max over ranks), algbw, busbw.
// Every (group, op, size) is also checked once with payloads that encode their source rank.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

#include "cli_common.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "parm/timer.h"

namespace parm::cli {
namespace {

struct BenchCommFlags {
  LayoutFlags layout;
  std::vector<std::string> groups = {"world", "mp", "ep", "esp", "dp", "edp"};
  std::vector<std::string> ops = {"allreduce", "allgather", "reduce_scatter", "alltoall"};
  int64_t min_bytes = 1024;
  int64_t max_bytes = 16 << 20;
  int64_t factor = 4;
  int iters = 20;
  int warmup = 3;
  std::string json;
};

CommOp parse_op(const std::string& s) {
  for (CommOp op : {CommOp::kAllReduce, CommOp::kAllGather, CommOp::kReduceScatter,
                    CommOp::kAllToAll})
    if (s == comm_op_name(op)) return op;
  throw InvalidConfig(fmt::format(
      "unknown op '{}'; valid ops: allreduce, allgather, reduce_scatter, alltoall", s));
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

int run_bench_comm(const BenchCommFlags& f) {
  PARM_CONFIG_CHECK(f.min_bytes >= 0 && f.max_bytes >= f.min_bytes,
                    "--min-bytes {} and --max-bytes {} must satisfy 0 <= min <= max",
                    f.min_bytes, f.max_bytes);
  PARM_CONFIG_CHECK(f.factor >= 2, "--step-factor {} must be at least 2", f.factor);
  PARM_CONFIG_CHECK(f.iters >= 1, "--iters {} must be at least 1", f.iters);
  std::vector<Group> groups;
  for (const auto& g : f.groups) groups.push_back(parse_group(g));
  std::vector<CommOp> ops;
  for (const auto& o : f.ops) ops.push_back(parse_op(o));
  auto topo = Topology::create(f.layout.topology());
  const bool root = topo->world_rank() == 0;
  Communicator& world = topo->comm(Group::kWorld);

  if (root) {
    std::printf("# parm bench-comm: %d ranks, %d node(s), %d iters (+%d warmup); times are the "
                "max over ranks of each iteration\n",
                topo->layout().world, topo->num_nodes(), f.iters, f.warmup);
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
        times = max_over_ranks(times);
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
  if (root) {
    std::printf("# GB/s = 1e9 bytes/s; busbw = algbw x (n-1)/n (allreduce: 2(n-1)/n)\n");
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
  app->add_option("--ops", f->ops, "collectives to measure")->delimiter(',');
  app->add_option("--min-bytes", f->min_bytes, "smallest buffer per rank");
  app->add_option("--max-bytes", f->max_bytes, "largest buffer per rank");
  app->add_option("--step-factor", f->factor, "size multiplier between rows");
  app->add_option("--iters", f->iters, "timed iterations per row");
  app->add_option("--warmup", f->warmup, "untimed iterations per row");
  app->add_option("--json", f->json, "also write the rows to this JSON file");
  return {app, [f] { return run_bench_comm(*f); }};
}

}  // namespace parm::cli
