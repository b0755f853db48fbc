// Counts C++ heap allocations of this test binary: alloc_counter.cpp replaces the global
// operator new (all forms) with a counting one that forwards to malloc. Allocations made in
// C (malloc inside MPI or oneDNN) are not seen; ours, through new / std containers /
// std::function / make_unique, all are.
#pragma once

#include <cstdint>

namespace parm::test {

// operator new calls so far in this process (all threads).
int64_t heap_allocations();

}  // namespace parm::test
