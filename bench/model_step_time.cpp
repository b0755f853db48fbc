// Step time of a tiny GPT-2-MoE forward_backward under each schedule, on layouts (1, N, 1)
// and, for an even world N, (2, N/2, 2): a measurement, printed by rank 0, never a check.
//
//   PARM_BIN=build/parm_model_bench scripts/parmrun -n 4 -- --steps 5
//   (elsewhere: mpirun -np 4 build/parm_model_bench [--steps N])
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "comm/process.h"
#include "model/model.h"
#include "parm/error.h"
#include "parm/rng.h"
#include "parm/timer.h"
#include "parm/topology.h"

namespace parm::model {
namespace {

using schedule::Kind;

// The timed steps per (layout, schedule), after one untimed warm-up step.
int parse_steps(int argc, char** argv) {
  int steps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
      continue;
    }
    throw InvalidConfig(fmt::format("unknown argument '{}'; usage: "
                                    "parm_model_bench [--steps N]", argv[i]));
  }
  PARM_CONFIG_CHECK(steps >= 1, "--steps {} must be at least 1", steps);
  return steps;
}

void run(int steps) {
  const int p = process::world_size();
  ModelConfig c;
  c.vocab = 256;
  c.seq_len = 64;
  c.model_dim = 128;
  c.num_heads = 4;
  c.num_layers = 4;
  c.ffn_hidden = 512;
  c.moe_every = 2;
  c.experts = 4 * ((p + 3) / 4);
  c.expert_hidden = 512;
  c.topk = 2;
  c.capacity_factor = "1.25";
  struct L3 {
    int mp, ep, esp;
  };
  std::vector<L3> lays = {{1, p, 1}};
  if (p % 2 == 0) lays.push_back({2, p / 2, 2});
  for (const L3& l : lays) {
    TopologyOptions o;
    o.mp = l.mp;
    o.ep = l.ep;
    o.esp = l.esp;
    auto topo = Topology::create(o);
    for (Kind k : {Kind::kBaseline, Kind::kS1, Kind::kS2}) {
      const int64_t B = 8;
      auto model = make_model(*topo, c, {{k, k != Kind::kBaseline, 4}}, B);
      Batch b;
      b.batch = B;
      b.seq_len = c.seq_len;
      Rng rng(5, static_cast<uint64_t>(topo->comm(Group::kDp).rank()));
      for (int64_t i = 0; i < B * c.seq_len; ++i) {
        b.tokens.push_back(static_cast<int32_t>(rng.next_u32() % 256));
        b.targets.push_back(static_cast<int32_t>(rng.next_u32() % 256));
      }
      const double denom = static_cast<double>(B * c.seq_len * topo->layout().dp);
      model->forward_backward(b, {denom, 1.0}, 1.0f);  // warm-up
      double total = 0, comm = 0;
      for (int s = 0; s < steps; ++s) {
        topo->comm(Group::kWorld).barrier();
        const double t0 = now_us();
        model->forward_backward(b, {denom, 1.0}, 1.0f);
        total += now_us() - t0;
        comm += model->last_comm_us();
      }
      if (topo->world_rank() == 0)
        std::printf("tiny gpt2-moe B=%ld L=%ld M=%ld layers=%ld E=%ld  mp=%d ep=%d esp=%d %-8s "
                    "step %.1f ms (comm %.1f ms), %.0f tokens/s per MP group, %.2f GFLOP/s/rank\n",
                    static_cast<long>(B), static_cast<long>(c.seq_len),
                    static_cast<long>(c.model_dim), static_cast<long>(c.num_layers),
                    static_cast<long>(c.experts), l.mp, l.ep, l.esp, schedule::kind_name(k),
                    total / steps / 1e3, comm / steps / 1e3,
                    B * c.seq_len / (total / steps / 1e6),
                    model->flops_per_step(B * c.seq_len) / (total / steps / 1e6) / 1e9);
    }
  }
}

}  // namespace
}  // namespace parm::model

int main(int argc, char** argv) {
  parm::process::init(&argc, &argv);
  try {
    parm::model::run(parm::model::parse_steps(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parm_model_bench: rank %d: %s\n", parm::process::world_rank(),
                 e.what());
    parm::process::abort_job(1);
  }
  parm::process::finalize();
  return 0;
}
