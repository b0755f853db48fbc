#include "shape/shape.h"

#include <limits>

#include "parm/error.h"

namespace parm {
namespace {

constexpr int kMaxDigits = 18;  // 10^18 < 2^63, so num and den always fit in int64

bool is_digit(char c) { return c >= '0' && c <= '9'; }

[[noreturn]] void refuse(std::string_view text, std::string_view why) {
  throw InvalidConfig(fmt::format(
      "capacity factor '{}' is not valid: {}; write a positive decimal such as 1, 1.25, "
      "0.5 or 2.0, or none for dropless routing (digits with at most one '.', digits on both sides of it, at most {} "
      "digits, no sign or exponent)",
      text, why, kMaxDigits));
}

}  // namespace

CapacityFactor CapacityFactor::parse(std::string_view text) {
  if (text == "none") return none();
  if (text.empty()) refuse(text, "it is empty");
  if (text.front() == '-') refuse(text, "it is negative");
  const size_t dot = text.find('.');
  const std::string_view int_part = text.substr(0, dot);
  const std::string_view frac_part =
      dot == std::string_view::npos ? std::string_view{} : text.substr(dot + 1);
  for (std::string_view part : {int_part, frac_part}) {
    for (char c : part) {
      if (c == 'e' || c == 'E') refuse(text, "exponent forms are not accepted");
      if (!is_digit(c)) refuse(text, fmt::format("unexpected character '{}'", c));
    }
  }
  if (int_part.empty()) refuse(text, "there is no digit before the '.'");
  if (dot != std::string_view::npos && frac_part.empty())
    refuse(text, "there is no digit after the '.'");
  if (int_part.size() + frac_part.size() > kMaxDigits) refuse(text, "too many digits");

  CapacityFactor f{0, 1};
  for (char c : int_part) f.num = f.num * 10 + (c - '0');
  for (char c : frac_part) {
    f.num = f.num * 10 + (c - '0');
    f.den *= 10;
  }
  if (f.num == 0) refuse(text, "it must be greater than 0");
  return f;
}

double CapacityFactor::value() const {
  if (dropless) return std::numeric_limits<double>::infinity();
  return static_cast<double>(num) / static_cast<double>(den);
}

std::string CapacityFactor::str() const {
  if (dropless) return "none";
  int decimals = 0;
  int64_t q = den;
  while (q > 1 && q % 10 == 0) {
    q /= 10;
    ++decimals;
  }
  if (q != 1 || num < 0) return fmt::format("{}/{}", num, den);
  if (decimals == 0) return fmt::format("{}", num);
  return fmt::format("{}.{:0{}}", num / den, num % den, decimals);
}

int64_t capacity(int k, CapacityFactor f, int64_t tokens, int64_t experts) {
  PARM_CONFIG_CHECK(k >= 1, "capacity: top-k must be >= 1, got k = {}", k);
  PARM_CONFIG_CHECK(tokens >= 0, "capacity: token count must be >= 0, got {}", tokens);
  PARM_CONFIG_CHECK(experts >= 1, "capacity: expert count must be >= 1, got {}", experts);
  if (f.dropless) return tokens;  // a token's k choices are k distinct experts
  PARM_CONFIG_CHECK(f.num >= 0 && f.den >= 1,
                    "capacity: factor {}/{} must have num >= 0 and den >= 1", f.num, f.den);
  int64_t numer = 0, denom = 0;
  const bool overflow = __builtin_mul_overflow(static_cast<int64_t>(k), f.num, &numer) ||
                        __builtin_mul_overflow(numer, tokens, &numer) ||
                        __builtin_mul_overflow(f.den, experts, &denom);
  PARM_CONFIG_CHECK(!overflow,
                    "capacity: k * f * tokens / experts = {} * {} * {} / {} overflows int64", k,
                    f.str(), tokens, experts);
  return numer / denom + (numer % denom != 0 ? 1 : 0);  // ceil of a non-negative ratio
}

MoeShape MoeShape::of(int64_t T, int64_t M, int64_t H, int64_t E, int k, const std::string& f) {
  MoeShape s;
  s.tokens = T;
  s.model_dim = M;
  s.hidden = H;
  s.experts = E;
  s.topk = k;
  s.capacity_factor = CapacityFactor::parse(f);
  return s;
}

void check_shared_overlap(int shared_experts, bool shared_overlap) {
  PARM_CONFIG_CHECK(shared_experts > 0 || !shared_overlap,
                    "--shared-overlap on (parallel.shared_overlap) needs shared experts: set "
                    "--shared-experts N >= 1 (model.shared_experts), or --shared-overlap off");
}

void MoeShape::validate(int num_slices) const {
  PARM_CONFIG_CHECK(tokens >= 1 && model_dim >= 1 && hidden >= 1 && experts >= 1,
                    "MoE shape {}: T, M, H and E must all be >= 1", str());
  PARM_CONFIG_CHECK(topk >= 1 && topk <= experts,
                    "MoE shape {}: top-k must be in [1, E = {}], got k = {}", str(), experts,
                    topk);
  PARM_CONFIG_CHECK(capacity_factor.dropless ||
                        (capacity_factor.num >= 1 && capacity_factor.den >= 1),
                    "MoE shape {}: capacity factor must be > 0", str());
  PARM_CONFIG_CHECK(num_slices >= 1, "MoE shape {}: num_slices must be >= 1, got {}", str(),
                    num_slices);
  PARM_CONFIG_CHECK(tokens % num_slices == 0,
                    "MoE shape {}: T = {} tokens cannot be cut into {} equal slices; T must "
                    "be a multiple of num_slices",
                    str(), tokens, num_slices);
  router.validate(experts, topk);
  PARM_CONFIG_CHECK(shared_experts >= 0 && shared_experts <= 64,
                    "--shared-experts (model.shared_experts) {} must be in [0, 64] (0: none)",
                    shared_experts);
  PARM_CONFIG_CHECK(shared_experts == 0 || shared_hidden >= 1,
                    "--shared-hidden (model.shared_hidden) {} must be >= 1 with {} shared "
                    "experts",
                    shared_hidden, shared_experts);
  PARM_CONFIG_CHECK(shared_experts > 0 || !shared_gate,
                    "--shared-gate on (model.shared_gate) needs shared experts: set "
                    "--shared-experts N >= 1, or --shared-gate off");
  check_shared_overlap(shared_experts, shared_overlap);
  PARM_CONFIG_CHECK(aux_seq_len >= 0 && (aux_seq_len == 0 || tokens % aux_seq_len == 0),
                    "MoE shape {}: the sequence-wise l_aux (--aux-loss sequence) needs T = {} "
                    "tokens to be whole sequences of L = {}; use an L that divides T",
                    str(), tokens, aux_seq_len);
}

std::string MoeShape::str() const {
  return fmt::format("T={} M={} H={} E={} k={} f={}{}{}", tokens, model_dim, hidden, experts,
                     topk, capacity_factor.str(), router.str(),
                     expert_mlp == ExpertMlp::kGelu ? ""
                                                    : std::string(" mlp=") +
                                                          expert_mlp_name(expert_mlp)) +
         (shared_experts == 0 ? std::string()
                              : fmt::format(" shared={}x{}{}", shared_experts, shared_hidden,
                                            shared_gate ? ",gated" : "")) +
         (aux_seq_len == 0 ? std::string() : fmt::format(" aux_seq={}", aux_seq_len)) +
         (pad_to_capacity || capacity_factor.dropless ? "" : " unpadded");
}

}  // namespace parm
