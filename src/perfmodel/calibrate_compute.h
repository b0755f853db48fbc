// calibrate's compute terms: the GEMM rate per class (profile.h GemmClass) and the bandwidth
// of the memory-bound kernels (MemClass), timed on every rank at once as in the layer, where
// ranks share the cores.
#pragma once

#include "parm/comm.h"
#include "perfmodel/bench_device.h"
#include "perfmodel/calibrate.h"
#include "perfmodel/calibrate_timing.h"

namespace parm::perfmodel {

// Refuses (InvalidConfig) GEMM shape lists calibrate_gemm cannot fit: every list needs sizes
// >= 1, and --gemm-rows two different row counts (each class's rate is a line over flops).
void check_gemm_shapes(const CalibrateOptions& o);

// Times the expert products of moe/experts.cpp by transpose class over o.gemm_rows x
// o.gemm_model_dims x o.gemm_hidden and the gate's over o.gate_experts, at o.precision, each
// sample over o.compute_window_us; fits t = alpha + flops / rate per class on the relative
// error (fit.h fit_line_relative; through the origin where the times do not grow with the
// flops) into cal.profile's gemm fits. Collective over `world`.
void calibrate_gemm(Communicator& world, const CalibrateOptions& o, BenchDevice& dev,
                    Calibration& cal, const Logger& log);

// Times the row copy and the bias + GeLU kernel on 64 KiB .. 2 MiB buffers and fits t = alpha
// + bytes / bandwidth per class into cal.profile's memory fits. Collective over `world`.
void calibrate_memory(Communicator& world, const CalibrateOptions& o, BenchDevice& dev,
                      Calibration& cal, const Logger& log);

}  // namespace parm::perfmodel
