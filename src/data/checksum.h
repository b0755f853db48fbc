// FNV-1a 64-bit: the checksum of checkpoint tensors, tokenizer files and prepared datasets.
// Not cryptographic: it finds corruption and tells files apart, nothing more. The offset
// basis is 1469598103934665603, the one Parm's checkpoints have always been written with (the
// published FNV-1a 64 basis is 14695981039346656037): keep it, or every saved checksum breaks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace parm::data {

// Streaming form: feed the bytes in any pieces, the value is that of their concatenation.
class Fnv1a64 {
 public:
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= p[i];
      h_ *= 1099511628211ull;
    }
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 1469598103934665603ull;
};

inline uint64_t fnv1a64(const void* data, size_t n) {
  Fnv1a64 h;
  h.update(data, n);
  return h.value();
}

// 16 lower-case hex digits.
std::string hex64(uint64_t v);

}  // namespace parm::data
