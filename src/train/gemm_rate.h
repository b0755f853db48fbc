// The GEMM rate per rank that the trainer's MFU divides by.
#pragma once

#include <string>

#include "parm/comm.h"
#include "parm/device.h"

namespace parm::train {

struct GemmRate {
  double gflops = 0.0;  // per rank
  std::string source;   // where it comes from, e.g. "calibrated, prof.json"
};

// On the CPU: the calibrated expert-GEMM rate of `profile` (measured with every rank of the
// machine busy), else measured now, all ranks at once for about 50 ms so that ranks sharing
// cores see it. At bf16 the products run the bf16 kernel, several times faster than fp32
// (AMX): the rate is that kernel's, measured now (profiles hold fp32 rates).
// On a device: the device's product at the run's precision (model::dense_ops' gemm, the one
// the dense layers run), 4096^3, measured now by every rank at once (ranks sharing a GPU see
// their share).
// Collective over `world` (the mean over its ranks) unless it reads the profile.
GemmRate gemm_rate_for_mfu(const std::string& profile, Precision precision, Device device,
                           Communicator& world);

}  // namespace parm::train
