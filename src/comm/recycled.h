// Storage recycling for the request objects of a communicator backend: `class R final :
// public TrackedRequest, public Recycled<R>` makes `new R` take a block that a deleted R left
// on this thread's free list (so the steady state of same-shaped operations allocates
// nothing). Per thread, so no lock; a plain pointer with no destructor, so a request deleted
// late in the thread's (or program's) exit still finds a valid list. Blocks are never
// returned to the system: at most the thread's peak of live requests. R must be final (every
// block has the size of one R) and say whether its storage may be reused
// (`bool recyclable() const`): a failed request's block is freed instead (tracked_request.h).
#pragma once

#include <cstddef>
#include <new>

namespace parm {

template <typename R>
class Recycled {
 public:
  static void* operator new(size_t bytes) {
    static_assert(sizeof(R) >= sizeof(FreeBlock), "a recycled block must hold the list link");
    if (FreeBlock* block = free_) {
      free_ = block->next;
      return block;
    }
    return ::operator new(bytes);
  }
  // A destroying delete: it sees the request before destroying it, so it can ask it.
  static void operator delete(Recycled* p, std::destroying_delete_t) {
    R* r = static_cast<R*>(p);
    const bool keep = r->recyclable();
    r->~R();
    if (keep)
      push(r);
    else
      ::operator delete(static_cast<void*>(r));
  }
  // The block of an R whose constructor threw (never a request): back on the list.
  static void operator delete(void* p) { push(p); }

 private:
  struct FreeBlock {
    FreeBlock* next;
  };
  static void push(void* p) {
    auto* block = static_cast<FreeBlock*>(p);
    block->next = free_;
    free_ = block;
  }
  static inline thread_local FreeBlock* free_ = nullptr;
};

}  // namespace parm
