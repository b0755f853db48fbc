// How many of a model's blocks each pipeline stage holds (--pp-split, parallel.pp_split).
// Pure: no MPI, no model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace parm::model {

// The default split: blocks / pp each, the first blocks % pp stages one more (the last stage
// also carries the head and the loss). Throws InvalidConfig when pp < 1 or there are fewer
// blocks than stages (each stage holds at least one block), naming the valid --pp values.
std::vector<int64_t> balanced_pp_split(int pp, int64_t blocks);

// Parses "3,3,3,3": pp positive block counts, comma-separated, summing to `blocks`; "" gives
// the balanced split. Throws InvalidConfig naming what is wrong and the valid form (with the
// balanced split as an example); `what` names the setting in them.
std::vector<int64_t> parse_pp_split(const std::string& text, int pp, int64_t blocks,
                                    const std::string& what = "--pp-split");

// "3,3,3,3".
std::string pp_split_text(const std::vector<int64_t>& split);

}  // namespace parm::model
