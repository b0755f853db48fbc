// Which blocks a pipeline stage holds.
#include "model/model.h"
#include "parm/error.h"

namespace parm::model {

StageBlocks stage_blocks(const std::vector<int64_t>& split, int stage) {
  PARM_CHECK(stage >= 0 && stage < static_cast<int>(split.size()),
             "stage {} of a {}-stage split", stage, split.size());
  StageBlocks s;
  s.stage = stage;
  s.num_stages = static_cast<int>(split.size());
  for (int i = 0; i < stage; ++i) s.begin += split[static_cast<size_t>(i)];
  s.end = s.begin + split[static_cast<size_t>(stage)];
  return s;
}

}  // namespace parm::model
