// The GEMM's thread count. Debian's libdnnl uses the OpenMP (libgomp) runtime, which would
// start one thread per core on the first call. We do not link OpenMP ourselves (it comes in
// with libdnnl), so its two entry points are looked up in the running process.
#include "kernels/cpu/gemm_threads.h"

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl_config.h>

#include <atomic>
#include <cstdlib>

#include "kernels/cpu/kernels.h"
#include "parm/error.h"

namespace parm::cpu {
namespace {

// 0: not set by set_gemm_threads().
std::atomic<int> g_requested{0};

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
struct OmpApi {
  void (*set_num_threads)(int) = nullptr;
  int (*get_max_threads)() = nullptr;
};

const OmpApi& omp_api() {
  static const OmpApi api = [] {
    OmpApi a;
    a.set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    a.get_max_threads = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    PARM_CHECK(a.set_num_threads != nullptr && a.get_max_threads != nullptr,
               "oneDNN runs on OpenMP, but omp_set_num_threads/omp_get_max_threads are not "
               "loaded in this process");
    return a;
  }();
  return api;
}

// The count this thread should use, or 0 to leave OpenMP's own setting alone.
int target_threads() {
  const int requested = g_requested.load(std::memory_order_relaxed);
  if (requested > 0) return requested;
  static const bool env_set = std::getenv("OMP_NUM_THREADS") != nullptr;
  return env_set ? 0 : 1;
}
#endif

}  // namespace

void set_gemm_threads(int num_threads) {
  PARM_CHECK_GE(num_threads, 1);
  g_requested.store(num_threads, std::memory_order_relaxed);
}

int gemm_threads() {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  const int target = target_threads();
  return target > 0 ? target : omp_api().get_max_threads();
#else
  return 1;  // sequential build (other runtimes are not used by this project)
#endif
}

namespace detail {

int apply_gemm_threads() {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  // OpenMP's thread count is per thread: every thread that calls gemm() sets its own.
  thread_local int applied = 0;
  const int target = target_threads();
  if (target == 0) return omp_api().get_max_threads();
  if (target != applied) {
    omp_api().set_num_threads(target);
    applied = target;
  }
  return target;
#else
  return 1;
#endif
}

}  // namespace detail
}  // namespace parm::cpu
