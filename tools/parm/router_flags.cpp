#include "router_flags.h"

#include "parm/error.h"

namespace parm::cli {

bool parse_on_off(const std::string& text, const char* what) {
  if (text == "on") return true;
  if (text == "off") return false;
  throw InvalidConfig(fmt::format("{} '{}' is not valid; use on or off", what, text));
}

void RouterFlags::add_to(CLI::App* app) {
  score_opt = app->add_option("--router-score", score,
                              "the router's scores: softmax (default) or sigmoid "
                              "(DeepSeek-V3; l_aux then uses them normalised per token)");
  norm_opt = app->add_option("--router-topk-norm", topk_norm,
                             "on (default): the k combine weights divided by their sum (k > "
                             "1); off: the scores themselves");
  scale_opt = app->add_option("--router-scale", scale,
                              "the combine weights times this (default 1)");
  groups_opt = app->add_option("--router-groups", groups,
                               "group-limited routing: G groups of E/G consecutive experts "
                               "(G = the EP size: EP ranks; G = the nodes: nodes; 1: off)");
  group_topk_opt = app->add_option("--router-group-topk", group_topk,
                                   "groups a token may route to (the K_g of largest score, "
                                   "a group's score the sum of its top-2 scores)");
}

void RouterFlags::apply(RouterSpec& r) const {
  if (score_opt->count() > 0) r.score = parse_router_score(score);
  if (norm_opt->count() > 0)
    r.topk_norm = parse_on_off(topk_norm, "--router-topk-norm (model.router_topk_norm)");
  if (scale_opt->count() > 0) r.scale = scale;
  if (groups_opt->count() > 0) r.groups = groups;
  if (group_topk_opt->count() > 0) r.group_topk = group_topk;
}

}  // namespace parm::cli
