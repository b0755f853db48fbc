// Errors and always-on checks. Library code throws; only `main` catches, prints and aborts
// the job (MPI_Abort) so that no rank is left waiting on a peer that died.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace parm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A configuration, layout or flag that cannot work; raised before any work starts.
class InvalidConfig : public Error {
 public:
  explicit InvalidConfig(const std::string& msg) : Error(msg) {}
};

// A communication library call failed.
class CommError : public Error {
 public:
  explicit CommError(const std::string& msg) : Error(msg) {}
};

// An operation ran past its deadline (a peer is probably stuck or dead).
class Timeout : public Error {
 public:
  explicit Timeout(const std::string& msg) : Error(msg) {}
};

// "1, 2, 3, 6": the valid values of a size that must divide n, for configuration messages.
std::string divisors_of(int64_t n);

namespace detail {
[[noreturn]] void throw_check_failure(const char* file, int line, const char* cond,
                                      const std::string& msg);
}  // namespace detail

}  // namespace parm

// PARM_CHECK(cond, "format {}", args...) : always on, throws parm::Error with file:line.
#define PARM_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) [[unlikely]]                                                          \
      ::parm::detail::throw_check_failure(__FILE__, __LINE__, #cond,                   \
                                          ::fmt::format(__VA_ARGS__));                 \
  } while (0)

#define PARM_CHECK_OP_(a, b, op)                                                       \
  do {                                                                                 \
    const auto& parm_a_ = (a);                                                         \
    const auto& parm_b_ = (b);                                                         \
    if (!(parm_a_ op parm_b_)) [[unlikely]]                                            \
      ::parm::detail::throw_check_failure(                                             \
          __FILE__, __LINE__, #a " " #op " " #b,                                       \
          ::fmt::format("{} vs {}", parm_a_, parm_b_));                                \
  } while (0)

// Comparison checks print both sides.
#define PARM_CHECK_EQ(a, b) PARM_CHECK_OP_(a, b, ==)
#define PARM_CHECK_NE(a, b) PARM_CHECK_OP_(a, b, !=)
#define PARM_CHECK_LT(a, b) PARM_CHECK_OP_(a, b, <)
#define PARM_CHECK_LE(a, b) PARM_CHECK_OP_(a, b, <=)
#define PARM_CHECK_GT(a, b) PARM_CHECK_OP_(a, b, >)
#define PARM_CHECK_GE(a, b) PARM_CHECK_OP_(a, b, >=)

// Throws parm::InvalidConfig with the formatted message when cond is false.
#define PARM_CONFIG_CHECK(cond, ...)                                                   \
  do {                                                                                 \
    if (!(cond)) [[unlikely]] throw ::parm::InvalidConfig(::fmt::format(__VA_ARGS__)); \
  } while (0)
