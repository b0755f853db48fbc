// Capacity factor and expert capacity (SPEC §2 item 3), in exact integer arithmetic.
//
// The factor is kept as the decimal the user wrote, p/q with q a power of ten ("1.1" is
// 11/10, not the double 1.1000000000000000888), so that C = ceil(k * f * T / E) comes out
// the same on every rank and in every language: ceil(1.1 * 3000 / 4) is 825, while the
// same sum in doubles gives 826.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace parm {

struct CapacityFactor {
  int64_t num = 1;  // p
  int64_t den = 1;  // q >= 1; a power of ten when parsed, not reduced ("1.2" -> 12/10)

  // Parses a positive decimal: digits, optionally '.' and more digits ("1", "1.25",
  // "0.5", "2.0"), at most 18 digits in all. No sign, exponent, blanks, "1." or ".5".
  // Throws parm::InvalidConfig naming the bad text and the valid form.
  static CapacityFactor parse(std::string_view text);

  double value() const { return static_cast<double>(num) / static_cast<double>(den); }
  // The decimal it was parsed from ("2.0" -> "2.0"); "num/den" when den is not a power
  // of ten.
  std::string str() const;

  bool operator==(const CapacityFactor&) const = default;  // field-wise: 12/10 != 6/5
};

// Slots per expert for one gate call that sees `tokens` tokens:
// C = ceil(k * num * tokens / (den * experts)), in integers. No minimum (0 when tokens is
// 0). Throws parm::InvalidConfig for k < 1, tokens < 0, experts < 1, a factor with
// num < 0 or den < 1, or a product that does not fit in int64.
int64_t capacity(int k, CapacityFactor f, int64_t tokens, int64_t experts);

}  // namespace parm
