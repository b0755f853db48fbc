// Every MPI call goes through PARM_MPI_CHECK: a failure throws parm::CommError with the
// statement and MPI's own error string. Communicators use MPI_ERRORS_RETURN so that errors
// come back here instead of killing the process silently.
#pragma once

#include <mpi.h>

#include <string>

#include "parm/error.h"

namespace parm::detail {

inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(buf, static_cast<size_t>(len));
}

}  // namespace parm::detail

#define PARM_MPI_CHECK(stmt)                                                           \
  do {                                                                                 \
    const int parm_mpi_rc_ = (stmt);                                                   \
    if (parm_mpi_rc_ != MPI_SUCCESS) [[unlikely]]                                      \
      throw ::parm::CommError(::fmt::format("{} failed at {}:{}: {}", #stmt, __FILE__, \
                                            __LINE__,                                  \
                                            ::parm::detail::mpi_error_string(parm_mpi_rc_))); \
  } while (0)
