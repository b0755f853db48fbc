// The MPI process runtime: what a program does before its first Topology exists and after
// its last one is gone (start, stop, abort, who am I, which MPI). Everything between talks
// to the other ranks through a Communicator (parm/comm.h), with its deadlines and counters.
#pragma once

#include <string>

namespace parm::process {

// MPI_Init. MPI_COMM_WORLD then returns errors to the caller instead of killing the job.
void init(int* argc, char*** argv);
// MPI_Finalize; a no-op when MPI was never initialized or is finalized already.
void finalize();
// Ends every rank of the job with exit code `code` (MPI_Abort), so that no rank waits
// forever on one that failed.
[[noreturn]] void abort_job(int code);

// Rank and size in the whole job (0 and 1 before init()).
int world_rank();
int world_size();

// A barrier over every rank of the job that gives up after `timeout_s`: true when every rank
// reached it in time. For the end of a job, where no Topology may exist.
bool barrier_within(double timeout_s);

// The first line of the MPI library's version string, e.g. "Open MPI v4.1.4".
std::string mpi_library();

}  // namespace parm::process
