#include "shape/expert_mlp.h"

#include "parm/error.h"

namespace parm {

const char* expert_mlp_name(ExpertMlp m) { return m == ExpertMlp::kSwiglu ? "swiglu" : "gelu"; }

ExpertMlp parse_expert_mlp(const std::string& text) {
  if (text == "gelu") return ExpertMlp::kGelu;
  if (text == "swiglu") return ExpertMlp::kSwiglu;
  throw InvalidConfig(fmt::format(
      "--expert-mlp (model.expert_mlp) '{}' is not valid; use gelu or swiglu", text));
}

}  // namespace parm
