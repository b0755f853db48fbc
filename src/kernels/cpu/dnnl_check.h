// Every oneDNN call goes through PARM_DNNL_CHECK: a failure throws parm::Error with the
// statement, where it was made and oneDNN's own status string. Private to the CPU kernels.
#pragma once

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "parm/error.h"

#define PARM_DNNL_CHECK(stmt)                                                                   \
  do {                                                                                          \
    const dnnl_status_t parm_dnnl_status_ = (stmt);                                             \
    if (parm_dnnl_status_ != dnnl_success) [[unlikely]]                                         \
      throw ::parm::Error(::fmt::format("{} failed at {}:{}: oneDNN status {} ({})", #stmt,     \
                                        __FILE__, __LINE__, dnnl_status2str(parm_dnnl_status_), \
                                        static_cast<int>(parm_dnnl_status_)));                  \
  } while (0)
