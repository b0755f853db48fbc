// `parm info`: version, build options, GEMM backend and threads, and each rank's resolved
// groups.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <cstdlib>

#include "cli_common.h"
#include "comm/process.h"
#include "kernels/cpu/kernels.h"

namespace parm::cli {
namespace {

constexpr Group kShownGroups[] = {Group::kMp, Group::kDp, Group::kEp,
                                  Group::kEsp, Group::kEdp, Group::kPp};

int run_info(const LayoutFlags& flags) {
  auto topo = Topology::create(flags.topology());
  if (topo->world_rank() != 0) return 0;
  const Layout& l = topo->layout();
  const std::string mpi_line = process::mpi_library();

  std::printf("parm %s (%s build, C++%ld)\n", PARM_VERSION, PARM_BUILD_TYPE, __cplusplus / 100 - 2000);
  std::printf("gemm:   %s\n", cpu::gemm_backend());
  // The GEMMs run on one thread per rank unless OMP_NUM_THREADS says otherwise
  // (kernels/cpu/kernels.h): say so, since nothing else does.
  const int threads = cpu::gemm_threads();
  const char* omp_env = std::getenv("OMP_NUM_THREADS");
  if (omp_env != nullptr)
    std::printf("threads: GEMMs on %d thread%s per rank (OMP_NUM_THREADS=%s)\n", threads,
                threads == 1 ? "" : "s", omp_env);
  else
    std::printf("threads: GEMMs on %d thread%s per rank: OMP_NUM_THREADS is unset; set it "
                "for more (OMP_NUM_THREADS=T mpirun -x OMP_NUM_THREADS ..., or "
                "scripts/parmrun --threads T), with ranks x T at most the cores\n",
                threads, threads == 1 ? "" : "s");
  std::printf("bf16:   cpu %s; products: %s; oneDNN's bf16 matmul here: %s\n",
              cpu::cpu_bf16_capability(), cpu::bf16_kernel_name(),
              cpu::onednn_bf16_matmul_impl().c_str());
  std::printf("mpi:    %s\n", mpi_line.c_str());
  std::printf("cuda:   %s\n",
              !cuda_built() ? "not built (configure with -DPARM_CUDA=ON where the CUDA toolkit, "
                              "cuBLAS and NCCL are installed)"
                            : fmt::format("built; {} GPU(s) visible to rank 0",
                                          cuda_device_count()).c_str());
  std::printf("world:  %d ranks on %d node%s (%s)\n", l.world, topo->num_nodes(),
              topo->num_nodes() == 1 ? "" : "s",
              topo->nodes_emulated() ? "emulated by --ranks-per-node" : "detected by shared memory");
  for (int n = 0; n < topo->num_nodes(); ++n)
    std::printf("  node %d: %s\n", n, topo->node_names()[static_cast<size_t>(n)].c_str());
  std::printf("layout: pp=%d stages | dense dp=%d x mp=%d | moe edp=%d x ep=%d x esp=%d\n",
              l.pp, l.dp, l.mp, l.edp, l.ep, l.esp);
  std::printf("order:  %s (innermost first; dense nests mp, dp, pp and moe esp, ep, edp, pp "
              "in this order; docs/layout.md)\n",
              l.order_name().c_str());
  std::vector<int> node_of(static_cast<size_t>(l.world));
  for (int r = 0; r < l.world; ++r) node_of[static_cast<size_t>(r)] = topo->node_of(r);

  std::printf("groups:\n");
  for (Group g : kShownGroups) {
    int intra = 0, instances = 0;
    for (int r = 0; r < l.world; ++r) {
      if (group_coord(l, g, r).rank != 0) continue;
      ++instances;
      intra += group_is_intra_node(l, g, r, node_of) ? 1 : 0;
    }
    const char* kind = intra == instances ? "intra-node" : (intra == 0 ? "inter-node" : "mixed");
    std::printf("  %-4s %d group%s of %d rank%s: %s\n", group_name(g), instances,
                instances == 1 ? "" : "s", l.group_size(g), l.group_size(g) == 1 ? "" : "s", kind);
  }
  std::printf("ranks:\n");
  for (int r = 0; r < l.world; ++r) {
    std::string line = fmt::format("  rank {:<3} node {:<2} stage {:<2}", r,
                                   node_of[static_cast<size_t>(r)], stage_of(l, r));
    for (Group g : kShownGroups) {
      line += fmt::format("  {}=[{}]:{}", group_name(g), fmt::join(group_members(l, g, r), ","),
                          group_is_intra_node(l, g, r, node_of) ? "intra" : "inter");
    }
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

}  // namespace

Command add_info(CLI::App& root) {
  auto* app = root.add_subcommand("info", "version, build, GEMM backend and the rank layout");
  auto flags = std::make_shared<LayoutFlags>();
  flags->add_to(app);
  return {app, [flags] { return run_info(*flags); }};
}

}  // namespace parm::cli
