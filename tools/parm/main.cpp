// `parm`: the command-line tool. Only this file catches errors: the failing rank prints its
// error and the whole job is aborted (MPI_Abort) so that no rank waits forever on it.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <exception>

#include "cli_common.h"
#include "parm/error.h"
#include "parm/timer.h"

namespace {

// All ranks refuse the same bad configuration (validation depends only on the flags and
// the world size): rank 0 prints it once and everyone exits cleanly. If some rank did not
// fail within a few seconds, it is somewhere else: abort the job.
int finish_invalid_config(const parm::InvalidConfig& e) {
  const int rank = parm::cli::world_rank();
  if (rank == 0) std::fprintf(stderr, "parm: invalid configuration: %s\n", e.what());
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  const double deadline_us = parm::now_us() + 5e6;
  int done = 0;
  while (!done && parm::now_us() < deadline_us) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) usleep(1000);
  }
  if (!done) {
    if (rank != 0) std::fprintf(stderr, "parm: rank %d: invalid configuration: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return 2;
}

int fail(const char* kind, const char* what) {
  std::fprintf(stderr, "parm: %s on rank %d: %s\n", kind, parm::cli::world_rank(), what);
  std::fflush(stderr);
  if (parm::cli::world_size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Finalize();
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  CLI::App app{"parm: Mixture-of-Experts training under hybrid parallelism"};
  app.require_subcommand(1);
  std::vector<parm::cli::Command> commands = {parm::cli::add_info(app),
                                              parm::cli::add_bench_comm(app),
                                              parm::cli::add_bench_layer(app),
                                              parm::cli::add_check_layer(app),
                                              parm::cli::add_train(app),
                                              parm::cli::add_calibrate(app),
                                              parm::cli::add_plan(app),
                                              parm::cli::add_simulate(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = 0;
    if (parm::cli::world_rank() == 0) {
      code = app.exit(e);
    } else {
      code = e.get_exit_code();
    }
    MPI_Finalize();
    return code == 0 ? 0 : 2;
  }
  try {
    int code = 0;
    for (auto& c : commands)
      if (c.app->parsed()) code = c.run();
    MPI_Finalize();
    return code;
  } catch (const parm::InvalidConfig& e) {
    return finish_invalid_config(e);
  } catch (const parm::Timeout& e) {
    return fail("timeout", e.what());
  } catch (const std::exception& e) {
    return fail("error", e.what());
  }
}
