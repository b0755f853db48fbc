#include "comm/fused_rows.h"

#include <array>

#include "comm/fused.h"
#include "comm/fused_plan.h"
#include "shape/packed_rows.h"
#include "parm/error.h"

namespace parm {
namespace {

using fused_detail::Piece;
using fused_plan::Role;
using fused_plan::Work;
using Requests = std::vector<RequestPtr>;

// Piece c of segment i's routed rows: its first element and its length (elements).
struct Rows {
  float* data;
  int64_t elems;
};
Rows piece_rows(const Segments& s, int64_t i, int chunks, int c, int64_t row_elems) {
  const Piece pc = fused_detail::piece_of(static_cast<size_t>(s.fill_of(i)), chunks, c);
  return {s.rows(i, row_elems) + static_cast<int64_t>(pc.lo) * row_elems,
          static_cast<int64_t>(pc.len) * row_elems};
}

// Received bytes of each role's stage in one call, recorded at its end.
struct Received {
  std::array<double, fused_plan::kNumRoles> bytes{};
  void add(Role r, int64_t elems) {
    bytes[static_cast<size_t>(r)] += static_cast<double>(elems) * sizeof(float);
  }
};

// Posts the exchange of `send` with peer p and the receipt of `recv` from it (either may be
// empty: the peer computes the same sizes and posts nothing for it either).
void post_pair(Communicator& c, int p, const Rows& send, const Rows& recv, int tag, Role role,
               Received& got, Requests& reqs) {
  if (recv.elems > 0) {
    reqs.push_back(c.irecv_uncounted(recv.data, static_cast<size_t>(recv.elems), DType::kF32, p, tag));
    got.add(role, recv.elems);
  }
  if (send.elems > 0)
    reqs.push_back(c.isend_uncounted(send.data, static_cast<size_t>(send.elems), DType::kF32, p, tag));
}

// My own rows: a local copy between segments of the same routed count.
void copy_rows(const Rows& to, const Rows& from, RowOps& ops) {
  PARM_CHECK_EQ(to.elems, from.elems);
  ops.copy(to.data, from.data, to.elems);
}

// Lock-step over the plan; on failure the requests are dropped (each waits up to its
// deadline) before the error goes on. Records each stage's collective at the end.
template <typename Post>
void run(const fused_plan::Plan& plan, int chunks, Requests& reqs,
         const std::array<Communicator*, fused_plan::kNumRoles>& comms, const Received& got,
         const Post& post) {
  std::array<double, fused_plan::kMaxStages> busy_us{};
  try {
    busy_us = fused_plan::run_lock_step(plan, chunks, reqs, post);
  } catch (...) {
    reqs.clear();
    throw;
  }
  for (int j = 0; j < plan.num_stages; ++j) {
    const fused_plan::Stage& s = plan.stage(j);
    Communicator* c = comms[static_cast<size_t>(s.group)];
    if (c->size() <= 1) continue;  // a group of one records nothing, as the unfused op
    const CommOp op = s.records == CommOp::kAllToAll ? CommOp::kAllToAllv : s.records;
    c->record(op, got.bytes[static_cast<size_t>(s.group)], busy_us[static_cast<size_t>(j)]);
  }
}

void check_chunks(int chunks, const char* op) {
  PARM_CONFIG_CHECK(chunks >= 1,
                    "{}: chunks = {}; the number of pipeline pieces must be at least 1 "
                    "(1 = no pipelining)", op, chunks);
}

}  // namespace

void FusedRows::dispatch(Communicator& ep, Communicator& esp, const Segments& src,
                         const Segments& dst, int64_t row_elems, int chunks, RowOps& ops) {
  check_chunks(chunks, "fused row dispatch");
  const int n_ep = ep.size(), n_esp = esp.size(), me_ep = ep.rank(), me_esp = esp.rank();
  PARM_CHECK(src.count % n_ep == 0 && dst.count == src.count * n_esp,
             "fused row dispatch on {} x {} (rank {}): {} source and {} destination segments "
             "for {} EP x {} ESP ranks",
             ep.name(), esp.name(), ep.world_rank(), src.count, dst.count, n_ep, n_esp);
  const int64_t row = src.count, per = row / n_ep;  // one ESP rank's segments; one EP peer's
  const fused_plan::Plan plan =
      fused_plan::make_plan(fused_plan::Pipeline::kDispatch, {n_ep, n_esp, 1});
  Received got;
  const auto post = [&](Work work, int c, Requests& reqs) {
    ops.sync();  // the local copies of earlier steps, before messages read them
    if (work == Work::kEpAlltoall) {
      const int tag = fused_detail::tag_of(c, Role::kEp);
      for (int p = 0; p < n_ep; ++p)
        for (int64_t i = p * per; i < (p + 1) * per; ++i) {
          const Rows from = piece_rows(src, i, chunks, c, row_elems);
          const Rows to = piece_rows(dst, me_esp * row + i, chunks, c, row_elems);
          if (p == me_ep)
            copy_rows(to, from, ops);
          else
            post_pair(ep, p, from, to, tag, Role::kEp, got, reqs);
        }
      return;
    }
    PARM_CHECK(work == Work::kEspAllgather, "fused row dispatch: stage work {} is not the "
               "dispatch's", static_cast<int>(work));
    const int tag = fused_detail::tag_of(c, Role::kEsp);
    for (int q = 0; q < n_esp; ++q) {
      if (q == me_esp) continue;
      for (int64_t i = 0; i < row; ++i)
        post_pair(esp, q, piece_rows(dst, me_esp * row + i, chunks, c, row_elems),
                  piece_rows(dst, q * row + i, chunks, c, row_elems), tag, Role::kEsp, got,
                  reqs);
    }
  };
  run(plan, chunks, reqs_, {&ep, &esp, nullptr}, got, post);
}

void FusedRows::combine(Communicator& esp, Communicator& ep, const Segments& src,
                        const Segments& dst, float* scratch, int64_t row_elems, int chunks,
                        RowOps& ops, const MpPart* mp) {
  check_chunks(chunks, "fused row combine");
  const int n_ep = ep.size(), n_esp = esp.size(), me_ep = ep.rank(), me_esp = esp.rank();
  const int64_t row = dst.count, per = row / n_ep;
  PARM_CHECK(row % n_ep == 0 && src.count == row * n_esp,
             "fused row combine on {} x {} (rank {}): {} source and {} destination segments "
             "for {} EP x {} ESP ranks",
             esp.name(), ep.name(), esp.world_rank(), src.count, dst.count, n_ep, n_esp);
  Communicator* mpc = mp != nullptr ? mp->mp : nullptr;
  const int n_mp = mpc != nullptr ? mpc->size() : 1, me_mp = mpc != nullptr ? mpc->rank() : 0;
  PARM_CHECK(mp == nullptr || (mpc != nullptr && mp->full.count == row * n_mp),
             "fused row combine: the MP gather has {} parts for {} segments on {} MP ranks",
             mp != nullptr ? mp->full.count : 0, row, n_mp);
  const fused_plan::Plan plan = fused_plan::make_plan(
      mp != nullptr ? fused_plan::Pipeline::kCombineMp : fused_plan::Pipeline::kCombine,
      {n_ep, n_esp, n_mp});

  // The ESP sum's operands: peer q's rows of my part (src part me_esp, packed segment after
  // segment) land in scratch region q (q < me_esp) or q - 1, and the sum in the last region.
  // Without an ESP stage the sum of my own part is that part itself.
  const bool esp_stage = plan.runs(Role::kEsp);
  const int32_t* my_fill = src.fill + me_esp * row;
  first_.resize(static_cast<size_t>(row));
  const int64_t mine = packed_starts(my_fill, row, first_.data());  // routed rows of my part
  auto region = [&](int r) {
    Segments s{scratch + r * mine * row_elems, src.slots, my_fill, row, first_.data()};
    return s;
  };
  Segments reduced = region(n_esp - 1);
  if (!esp_stage) reduced = src;  // one ESP rank: src is my part
  auto theirs = [&](int q) { return region(q < me_esp ? q : q - 1); };

  Received got;
  const auto post = [&](Work work, int c, Requests& reqs) {
    ops.sync();
    switch (work) {
      case Work::kEspExchange: {
        const int tag = fused_detail::tag_of(c, Role::kEsp);
        for (int q = 0; q < n_esp; ++q) {
          if (q == me_esp) continue;
          const Segments in_q = theirs(q);
          for (int64_t k = 0; k < row; ++k)
            post_pair(esp, q, piece_rows(src, q * row + k, chunks, c, row_elems),
                      piece_rows(in_q, k, chunks, c, row_elems), tag, Role::kEsp, got, reqs);
        }
        return;
      }
      case Work::kEspSumEpAlltoall: {
        if (esp_stage)
          for (int64_t k = 0; k < row; ++k) {
            // ((r0 + r1) + r2) + ...: ESP-rank order, as RowExchange::reduce_scatter.
            const Rows to = piece_rows(reduced, k, chunks, c, row_elems);
            for (int q = 0; q < n_esp; ++q) {
              const Rows from = q == me_esp ? piece_rows(src, me_esp * row + k, chunks, c, row_elems)
                                            : piece_rows(theirs(q), k, chunks, c, row_elems);
              PARM_CHECK_EQ(from.elems, to.elems);
              if (q == 0)
                ops.copy(to.data, from.data, to.elems);
              else
                ops.add(to.data, from.data, to.elems);
            }
          }
        ops.sync();
        const int tag = fused_detail::tag_of(c, Role::kEp);
        for (int p = 0; p < n_ep; ++p)
          for (int64_t i = p * per; i < (p + 1) * per; ++i) {
            const Rows from = piece_rows(reduced, i, chunks, c, row_elems);
            const Rows to = piece_rows(dst, i, chunks, c, row_elems);
            if (p == me_ep)
              copy_rows(to, from, ops);
            else
              post_pair(ep, p, from, to, tag, Role::kEp, got, reqs);
          }
        return;
      }
      case Work::kMpGather: {
        const int tag = fused_detail::tag_of(c, Role::kMp);
        for (int64_t e = 0; e < row; ++e) {
          const Rows from = piece_rows(dst, e, chunks, c, row_elems);
          for (int q = 0; q < n_mp; ++q) {
            const Rows to = piece_rows(mp->full, e * n_mp + q, chunks, c, row_elems);
            if (q == me_mp)
              copy_rows(to, from, ops);
            else
              post_pair(*mpc, q, from, to, tag, Role::kMp, got, reqs);
          }
        }
        return;
      }
      default: break;
    }
    throw Error(fmt::format("fused row combine: stage work {} is not the combine's",
                            static_cast<int>(work)));
  };
  run(plan, chunks, reqs_, {&ep, &esp, mpc}, got, post);
  // An MP group of one without its stage: its one part of `full` is dst itself.
  if (mp != nullptr && !plan.runs(Role::kMp))
    for (int64_t e = 0; e < row; ++e)
      copy_rows(piece_rows(mp->full, e, 1, 0, row_elems), piece_rows(dst, e, 1, 0, row_elems), ops);
  ops.sync();
}

}  // namespace parm
