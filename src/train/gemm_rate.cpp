#include "train/gemm_rate.h"

#include <cstdint>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kernels/cpu/kernels.h"
#include "model/dense_ops.h"
#include "parm/tensor.h"
#include "parm/timer.h"
#include "perfmodel/profile.h"

namespace parm::train {
namespace {

double device_gemm_gflops(Device device, Precision precision, Communicator& world) {
  const model::DenseOps& ops = model::dense_ops(device);
  const int64_t n = 4096;
  Tensor host({n, n});
  host.fill(0.5f);
  const Tensor a = host.to(device), b = host.to(device);
  Tensor c({n, n}, device);
  const auto product = [&] { ops.gemm(precision, false, false, n, n, n, a.data(), b.data(), c.data(), false); };
  product();  // warm up (and the library's first-call setup)
  device_sync();
  world.barrier();
  const int reps = 20;
  const double t0 = now_us();
  for (int i = 0; i < reps; ++i) product();
  device_sync();
  double rate = 2.0 * n * n * n * reps / ((now_us() - t0) * 1e3);
  world.allreduce(&rate, 1);
  return rate / world.size();
}

}  // namespace

GemmRate gemm_rate_for_mfu(const std::string& profile, Precision precision, Device device,
                           Communicator& world) {
  if (device != Device::kCpu)
    return {device_gemm_gflops(device, precision, world),
            fmt::format("{} {} GEMM measured at start", device_name(device),
                        precision_name(precision))};
  const bool bf16 = precision == Precision::kBf16;
  if (!profile.empty() && !bf16)
    return {perfmodel::read_profile(profile).gemm_fit(perfmodel::GemmClass::kExpertNN).gflops,
            "calibrated, " + profile};
  std::string source = bf16 ? fmt::format("bf16 GEMM measured at start, {}", cpu::bf16_kernel_name())
                            : "measured at start";
  const int64_t n = 384;
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a), c(a);
  cpu::Bf16Buffer pa(static_cast<size_t>(cpu::bf16_packed_a_size(n, n)));
  cpu::Bf16Buffer pb(static_cast<size_t>(cpu::bf16_packed_b_size(n, n)));
  cpu::bf16_pack_a(false, n, n, a.data(), n, pa.data());
  cpu::bf16_pack_b(false, n, n, b.data(), n, pb.data());
  const auto product = [&] {
    if (bf16)
      cpu::gemm_bf16_packed(n, n, n, pa.data(), pb.data(), c.data(), n, false);
    else
      cpu::gemm(false, false, n, n, n, a.data(), b.data(), c.data(), false);
  };
  product();  // warm up
  world.barrier();
  const double t0 = now_us();
  int reps = 0;
  for (; reps < 1000 && now_us() - t0 < 5e4; ++reps) product();
  double rate = 2.0 * n * n * n * reps / ((now_us() - t0) * 1e3);
  world.allreduce(&rate, 1);
  return {rate / world.size(), std::move(source)};
}

}  // namespace parm::train
