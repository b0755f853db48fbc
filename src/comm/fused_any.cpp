#include "comm/fused_any.h"

#include <cstring>

#include "parm/error.h"

namespace parm {

void check_same_backend(const Communicator& self, const Communicator& other, const char* op) {
  PARM_CHECK(std::strcmp(self.backend(), other.backend()) == 0,
             "rank {}: {} over group {} ({} communicator, {} memory) and group {} ({} "
             "communicator, {} memory): the groups of a fused collective must share a backend",
             self.world_rank(), op, self.name(), self.backend(),
             memory_space_name(self.memory_space()), other.name(), other.backend(),
             memory_space_name(other.memory_space()));
}

void fused_dispatch_any(Communicator& ep, Communicator& esp, const float* in, float* out,
                        size_t block, int chunks) {
  const size_t in_bytes = block * static_cast<size_t>(ep.size()) * sizeof(float);
  ep.check_buffer("fused dispatch", "in", in, in_bytes);
  ep.check_buffer("fused dispatch", "out", out, in_bytes * static_cast<size_t>(esp.size()));
  ep.run_fused_dispatch(esp, in, out, block, chunks);
}

void fused_combine_any(Communicator& esp, Communicator& ep, const float* in, float* out,
                       size_t block, int chunks, const MpGatherPart* mp_part) {
  const size_t out_bytes = block * static_cast<size_t>(ep.size()) * sizeof(float);
  esp.check_buffer("fused combine", "in", in, out_bytes * static_cast<size_t>(esp.size()));
  esp.check_buffer("fused combine", "out", out, out_bytes);
  if (mp_part != nullptr && mp_part->mp != nullptr)
    esp.check_buffer("fused combine", "mp full", mp_part->full,
                     out_bytes * static_cast<size_t>(mp_part->mp->size()));
  esp.run_fused_combine(ep, in, out, block, chunks, mp_part);
}

}  // namespace parm
