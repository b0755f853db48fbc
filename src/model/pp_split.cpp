#include "model/pp_split.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "parm/error.h"

namespace parm::model {

std::vector<int64_t> balanced_pp_split(int pp, int64_t blocks) {
  PARM_CONFIG_CHECK(pp >= 1, "--pp {} must be at least 1", pp);
  PARM_CONFIG_CHECK(blocks >= pp,
                    "--pp {} exceeds the model's {} blocks (each pipeline stage holds at least "
                    "one block); valid --pp values: 1 to {}",
                    pp, blocks, blocks);
  std::vector<int64_t> split(static_cast<size_t>(pp), blocks / pp);
  for (int64_t s = 0; s < blocks % pp; ++s) ++split[static_cast<size_t>(s)];
  return split;
}

std::string pp_split_text(const std::vector<int64_t>& split) {
  return fmt::format("{}", fmt::join(split, ","));
}

std::vector<int64_t> parse_pp_split(const std::string& text, int pp, int64_t blocks,
                                    const std::string& what) {
  const std::vector<int64_t> balanced = balanced_pp_split(pp, blocks);
  if (text.empty()) return balanced;
  const std::string valid = fmt::format(
      "a valid {} is {} positive block counts (one per stage, first to last), "
      "comma-separated, summing to the model's {} blocks, e.g. {}",
      what, pp, blocks, pp_split_text(balanced));
  std::vector<int64_t> split;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    bool digits = !item.empty() && item.size() <= 12;
    for (char ch : item) digits = digits && ch >= '0' && ch <= '9';
    PARM_CONFIG_CHECK(digits, "{} '{}': '{}' is not a block count; {}", what, text, item,
                      valid);
    split.push_back(std::stoll(item));
    PARM_CONFIG_CHECK(split.back() >= 1, "{} '{}': stage {} holds {} blocks; {}", what, text,
                      split.size() - 1, split.back(), valid);
    pos = comma + 1;
  }
  PARM_CONFIG_CHECK(static_cast<int>(split.size()) == pp,
                    "{} '{}' names {} stages but --pp is {}; {}", what, text, split.size(), pp,
                    valid);
  int64_t sum = 0;
  for (int64_t b : split) sum += b;
  PARM_CONFIG_CHECK(sum == blocks, "{} '{}' sums to {} blocks, not the model's {}; {}",
                    what, text, sum, blocks, valid);
  return split;
}

}  // namespace parm::model
