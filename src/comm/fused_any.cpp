#include "comm/fused_any.h"

#include <cstring>
#include <vector>

#include "comm/staged_communicator.h"
#include "parm/error.h"

#ifdef PARM_HAVE_CUDA
#include "comm/cuda/nccl_communicator.h"
#endif

namespace parm {
namespace {

StagedCommunicator* staged(Communicator& c) { return dynamic_cast<StagedCommunicator*>(&c); }

// A host staging area of `bytes`, recycled across calls (the executor runs one fused
// collective at a time per thread).
float* host_area(int slot, size_t bytes) {
  thread_local std::vector<float> areas[3];
  auto& a = areas[slot];
  if (a.size() * sizeof(float) < bytes) a.resize((bytes + sizeof(float) - 1) / sizeof(float));
  return a.data();
}

void check_same_kind(Communicator& a, Communicator& b) {
  PARM_CHECK((staged(a) != nullptr) == (staged(b) != nullptr),
             "fused collective over groups {} and {} of different kinds (staged vs not)",
             a.name(), b.name());
}

}  // namespace

void fused_dispatch_any(Communicator& ep, Communicator& esp, const float* in, float* out,
                        size_t block, int chunks) {
  check_same_kind(ep, esp);
#ifdef PARM_HAVE_CUDA
  if (is_nccl(ep) && is_nccl(esp)) {
    nccl_fused_dispatch(static_cast<NcclCommunicator&>(ep), static_cast<NcclCommunicator&>(esp),
                        in, out, block, chunks);
    return;
  }
#endif
  StagedCommunicator* sep = staged(ep);
  if (sep == nullptr) {
    fused_dispatch(ep, esp, in, out, block, chunks);
    return;
  }
  StagedCommunicator* sesp = staged(esp);
  const size_t in_bytes = block * static_cast<size_t>(ep.size()) * sizeof(float);
  const size_t out_bytes = in_bytes * static_cast<size_t>(esp.size());
  float* hin = host_area(0, in_bytes);
  float* hout = host_area(1, out_bytes);
  sep->copy_fn()(hin, in, in_bytes);
  fused_dispatch(sep->host(), sesp->host(), hin, hout, block, chunks);
  sep->copy_fn()(out, hout, out_bytes);
}

void fused_combine_any(Communicator& esp, Communicator& ep, const float* in, float* out,
                       size_t block, int chunks, const MpGatherPart* mp_part) {
  check_same_kind(ep, esp);
#ifdef PARM_HAVE_CUDA
  if (is_nccl(ep) && is_nccl(esp)) {
    nccl_fused_combine(static_cast<NcclCommunicator&>(esp), static_cast<NcclCommunicator&>(ep),
                       in, out, block, chunks, mp_part);
    return;
  }
#endif
  StagedCommunicator* sep = staged(ep);
  if (sep == nullptr) {
    fused_combine(esp, ep, in, out, block, chunks, mp_part);
    return;
  }
  StagedCommunicator* sesp = staged(esp);
  const size_t out_bytes = block * static_cast<size_t>(ep.size()) * sizeof(float);
  const size_t in_bytes = out_bytes * static_cast<size_t>(esp.size());
  float* hin = host_area(0, in_bytes);
  float* hout = host_area(1, out_bytes);
  sep->copy_fn()(hin, in, in_bytes);
  if (mp_part == nullptr || mp_part->mp == nullptr) {
    fused_combine(sesp->host(), sep->host(), hin, hout, block, chunks);
    sep->copy_fn()(out, hout, out_bytes);
    return;
  }
  StagedCommunicator* smp = staged(*mp_part->mp);
  PARM_CHECK(smp != nullptr, "fused combine: the mp group {} is not staged like ep/esp",
             mp_part->mp->name());
  const size_t full_bytes = out_bytes * static_cast<size_t>(mp_part->mp->size());
  MpGatherPart host_mp{&smp->host(), mp_part->outer, mp_part->chunk,
                       host_area(2, full_bytes)};
  fused_combine(sesp->host(), sep->host(), hin, hout, block, chunks, &host_mp);
  sep->copy_fn()(out, hout, out_bytes);
  sep->copy_fn()(mp_part->full, host_mp.full, full_bytes);
}

}  // namespace parm
