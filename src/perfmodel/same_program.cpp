#include "perfmodel/same_program.h"

#include <tuple>

namespace parm::perfmodel {
namespace {

// Everything of a buffer and a step the executor reads; names and labels are for people.
auto fields(const schedule::BufferSpec& b) { return std::tie(b.shape, b.slots, b.fills_like); }
auto fields(const schedule::Step& s) {
  return std::tie(s.kind, s.group, s.in, s.out, s.outer, s.chunk, s.group2, s.group3, s.mid,
                  s.block, s.carries_fills, s.joined_sum);
}
auto fields(const schedule::Schedule& s) {
  return std::tie(s.input, s.output, s.gate_tokens, s.total_tokens, s.capacity,
                  s.dispatch_slots, s.exchange_slots, s.expert_blocks, s.adds_b2,
                  s.gate_weight_numel, s.fused, s.dropless, s.packed, s.chunks);
}

template <typename T>
bool same_list(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (fields(a[i]) != fields(b[i])) return false;
  return true;
}

}  // namespace

bool same_program(const schedule::Schedule& a, const schedule::Schedule& b) {
  return fields(a) == fields(b) && same_list(a.buffers, b.buffers) && same_list(a.steps, b.steps);
}

}  // namespace parm::perfmodel
