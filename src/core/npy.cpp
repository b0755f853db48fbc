#include "parm/npy.h"

#include <fmt/format.h>

#include <cstring>

#include "parm/fileio.h"

namespace parm {
namespace {

std::string npy(const void* data, size_t elem_bytes, const char* descr, const Shape& shape) {
  std::string dims;
  for (int64_t d : shape) dims += fmt::format("{}, ", d);
  if (shape.size() > 1) dims.resize(dims.size() - 1);  // "(3, 4)" but "(3,)"
  if (shape.empty()) dims.clear();
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr,
                  shape.size() > 1 ? dims.substr(0, dims.size() - 1) : dims);
  // magic (6) + version (2) + header length (2) + header, padded to a multiple of 64.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.push_back(static_cast<char>(len & 0xff));
  out.push_back(static_cast<char>(len >> 8));
  out += header;
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * elem_bytes;
  out.append(static_cast<const char*>(data), bytes);
  return out;
}

}  // namespace

void write_npy(const std::string& path, const float* data, const Shape& shape) {
  write_file_atomic(path, npy(data, sizeof(float), "<f4", shape));
}

void write_npy(const std::string& path, const double* data, const Shape& shape) {
  write_file_atomic(path, npy(data, sizeof(double), "<f8", shape));
}

void write_npy(const std::string& path, const int32_t* data, const Shape& shape) {
  write_file_atomic(path, npy(data, sizeof(int32_t), "<i4", shape));
}

void write_npy(const std::string& path, const uint8_t* data, const Shape& shape) {
  write_file_atomic(path, npy(data, sizeof(uint8_t), "|u1", shape));
}

}  // namespace parm
