// The MoE layer's shape and its expert capacity (docs/spec.md §2 item 3): the vocabulary that the
// oracle (moe/reference_moe.h), the schedules (schedule/) and the distributed layer (moe/)
// share. It depends on nothing above src/core, so every one of them may include it.
//
// The capacity is computed in exact integer arithmetic.
// The factor is kept as the decimal the user wrote, p/q with q a power of ten ("1.1" is
// 11/10, not the double 1.1000000000000000888), so that C = ceil(k * f * T / E) comes out
// the same on every rank and in every language: ceil(1.1 * 3000 / 4) is 825, while the
// same sum in doubles gives 826.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "shape/expert_mlp.h"
#include "shape/router.h"

namespace parm {

struct CapacityFactor {
  int64_t num = 1;  // p
  int64_t den = 1;  // q >= 1; a power of ten when parsed, not reduced ("1.2" -> 12/10)
  bool dropless = false;  // "none": nothing drops (num, den unused)

  static CapacityFactor none() { return {0, 1, true}; }

  // Parses a positive decimal: digits, optionally '.' and more digits ("1", "1.25",
  // "0.5", "2.0"), at most 18 digits in all, or "none" (dropless). No sign, exponent,
  // blanks, "1." or ".5". Throws parm::InvalidConfig naming the bad text and the valid form.
  static CapacityFactor parse(std::string_view text);

  // f as a double; dropless: +infinity.
  double value() const;
  // The decimal it was parsed from ("2.0" -> "2.0"); "num/den" when den is not a power
  // of ten; "none" when dropless.
  std::string str() const;

  bool operator==(const CapacityFactor&) const = default;  // field-wise: 12/10 != 6/5
};

// Slots per expert for one gate call that sees `tokens` tokens:
// C = ceil(k * num * tokens / (den * experts)), in integers. No minimum (0 when tokens is
// 0). Dropless: C = tokens (see above). Throws parm::InvalidConfig for k < 1, tokens < 0, experts < 1, a factor with
// num < 0 or den < 1, or a product that does not fit in int64.
int64_t capacity(int k, CapacityFactor f, int64_t tokens, int64_t experts);

// The shared experts' width H_s: `shared_hidden`, or the routed experts' `hidden` where there
// are shared experts and it is 0 (the default of the layer commands, train's configs and
// parm.torch.MoE).
inline int64_t shared_width(int shared_experts, int64_t shared_hidden, int64_t hidden) {
  return shared_experts > 0 && shared_hidden == 0 ? hidden : shared_hidden;
}

struct MoeShape {
  int64_t tokens = 0;     // T: rows of x, in row order
  int64_t model_dim = 0;  // M
  int64_t hidden = 0;     // H: an expert's FFN hidden dim
  int64_t experts = 0;    // E
  int topk = 1;           // k
  CapacityFactor capacity_factor{1, 1};  // f
  RouterSpec router;      // score function, weights, group limit (docs/spec.md §7)
  ExpertMlp expert_mlp = ExpertMlp::kGelu;  // the experts' FFN (docs/spec.md §8)
  // Shared experts (docs/spec.md §9): N_s FFNs of the routed experts' kind and width H_s that
  // every token passes through, their sum added to the routed output (times the shared gate
  // sigmoid(x w_sg) when shared_gate). 0: none.
  int shared_experts = 0;
  int64_t shared_hidden = 0;
  bool shared_gate = false;
  // The schedules run the shared experts while the dispatch AllToAll is in flight (Megatron's
  // --moe-shared-expert-overlap; schedule::Step::overlap_next); off (the default, as there):
  // one after the other. Over MPI on CPUs the posted AllToAll did not move while the shared
  // experts computed (docs/spec.md §9, measured): no saving there.
  bool shared_overlap = false;
  // With a capacity factor: the exchanges move whole capacity buffers, E x C rows, the empty
  // slots as zeros (GShard's and DeepSpeed-MoE's layout, docs/spec.md §3; the default). Off
  // (Megatron-Core's default, whose --moe-pad-expert-input-to-capacity turns it on): they move
  // the kept rows only, packed, as dropless routing's do (docs/dropless.md). How the layer
  // runs, never what it computes. Dropless has no padding either way.
  bool pad_to_capacity = true;
  // The exchanges of expert rows move the routed (kept) rows only: dropless, or unpadded.
  bool packed_rows() const { return capacity_factor.dropless || !pad_to_capacity; }
  bool has_shared() const { return shared_experts > 0; }
  // The sequence-wise l_aux (docs/spec.md §7, aux-loss scope 'sequence'): L, the tokens of one
  // sequence; rows [s*L, (s+1)*L) of T are sequence s, and l_aux is the mean over the T / L
  // sequences of §2.7's l_aux over each. 0: §2.7 over all T tokens of the gate call.
  int64_t aux_seq_len = 0;
  // Sets of l_aux statistics the layer keeps: T / L sequence-wise, else 1.
  int64_t aux_sequences() const { return aux_seq_len > 0 ? tokens / aux_seq_len : 1; }

  // The shape from its sizes; f is a decimal ("1.2"), parsed exactly (CapacityFactor::parse).
  static MoeShape of(int64_t T, int64_t M, int64_t H, int64_t E, int k, const std::string& f);

  // Throws parm::InvalidConfig unless T, M, H, E >= 1, 1 <= k <= E, f > 0 (or none),
  // num_slices >= 1, T % num_slices == 0, the router's own checks (RouterSpec::validate), and
  // shared experts >= 0 with H_s >= 1 when there are any (and no gate and no overlap when
  // there are none: check_shared_overlap), and aux_seq_len 0 or a divisor of T.
  void validate(int num_slices = 1) const;
  // "T=8 M=4 H=6 E=4 k=2 f=1.25" (+ RouterSpec::str, + " mlp=swiglu" when not gelu, +
  // " shared=2x64" (",gated") with shared experts, + " aux_seq=L" sequence-wise, + " unpadded"
  // with a capacity factor and pad_to_capacity off)
  std::string str() const;
};

// The shared experts' overlap needs shared experts: throws parm::InvalidConfig naming
// --shared-overlap and --shared-experts unless shared_experts > 0 or the overlap is off
// (MoeShape::validate, and the trainer's config check before any work).
void check_shared_overlap(int shared_experts, bool shared_overlap);

}  // namespace parm
