// NumPy .npy files (format 1.0, little-endian), for dumps a user can load with numpy.load.
#pragma once

#include <cstdint>
#include <string>

#include "parm/tensor.h"

namespace parm {

// Writes float32 data of `shape` atomically.
void write_npy(const std::string& path, const float* data, const Shape& shape);
// Writes float64 data of `shape` atomically.
void write_npy(const std::string& path, const double* data, const Shape& shape);
// Writes int32 data of `shape` atomically.
void write_npy(const std::string& path, const int32_t* data, const Shape& shape);
// Writes uint8 data of `shape` atomically.
void write_npy(const std::string& path, const uint8_t* data, const Shape& shape);

}  // namespace parm
