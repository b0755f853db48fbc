// `parm`: the command-line tool. Only this file catches errors: the failing rank prints its
// error and the whole job is aborted (MPI_Abort) so that no rank waits forever on it.
#include <cstdio>
#include <exception>

#include "cli_common.h"
#include "comm/process.h"
#include "parm/error.h"

namespace {

// All ranks refuse the same bad configuration (validation depends only on the flags and
// the world size): rank 0 prints it once and everyone exits cleanly. If some rank did not
// fail within a few seconds, it is somewhere else: abort the job.
int finish_invalid_config(const parm::InvalidConfig& e) {
  const int rank = parm::process::world_rank();
  if (rank == 0) std::fprintf(stderr, "parm: invalid configuration: %s\n", e.what());
  if (!parm::process::barrier_within(5.0)) {
    if (rank != 0) std::fprintf(stderr, "parm: rank %d: invalid configuration: %s\n", rank, e.what());
    std::fflush(stderr);
    parm::process::abort_job(2);
  }
  parm::process::finalize();
  return 2;
}

int fail(const char* kind, const char* what) {
  std::fprintf(stderr, "parm: %s on rank %d: %s\n", kind, parm::process::world_rank(), what);
  std::fflush(stderr);
  if (parm::process::world_size() > 1) parm::process::abort_job(1);
  parm::process::finalize();
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  parm::process::init(&argc, &argv);
  CLI::App app{"parm: Mixture-of-Experts training under hybrid parallelism"};
  app.require_subcommand(1);
  std::vector<parm::cli::Command> commands = {parm::cli::add_info(app),
                                              parm::cli::add_bench_comm(app),
                                              parm::cli::add_bench_layer(app),
                                              parm::cli::add_check_layer(app),
                                              parm::cli::add_train(app),
                                              parm::cli::add_generate(app),
                                              parm::cli::add_calibrate(app),
                                              parm::cli::add_plan(app),
                                              parm::cli::add_simulate(app),
                                              parm::cli::add_tokenizer(app),
                                              parm::cli::add_prepare_data(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = 0;
    if (parm::process::world_rank() == 0) {
      code = app.exit(e);
    } else {
      code = e.get_exit_code();
    }
    parm::process::finalize();
    return code == 0 ? 0 : 2;
  }
  try {
    int code = 0;
    for (auto& c : commands)
      if (c.app->parsed()) code = c.run();
    parm::process::finalize();
    return code;
  } catch (const parm::InvalidConfig& e) {
    return finish_invalid_config(e);
  } catch (const parm::Timeout& e) {
    return fail("timeout", e.what());
  } catch (const std::exception& e) {
    return fail("error", e.what());
  }
}
