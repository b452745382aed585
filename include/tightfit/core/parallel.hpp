// tightfit/core/parallel.hpp: a parallel-for over oneTBB with a serial fallback.
//
// TIGHTFIT_HAS_TBB is defined to 1 by the tightfit::tbb CMake target. Without it every loop
// runs serially on the calling thread, with identical results (each index_t range is processed
// by the same body), which is what ThreadSanitizer builds use.
#pragma once

#include <algorithm>

#include "tightfit/core/types.hpp"

#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#endif

namespace tightfit {

/// Calls body(i0, i1) on disjoint ranges covering [begin, end), each at most `grain` long
/// when run serially, possibly concurrently when TBB is enabled.
template <class Body>
void parallel_for(index_t begin, index_t end, index_t grain, Body&& body) {
  if (end <= begin) return;
  grain = std::max<index_t>(grain, 1);
#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
  if (end - begin > grain) {
    tbb::parallel_for(tbb::blocked_range<index_t>(begin, end, grain),
                      [&](const tbb::blocked_range<index_t>& r) { body(r.begin(), r.end()); });
    return;
  }
#endif
  for (index_t i0 = begin; i0 < end; i0 += grain) body(i0, std::min(end, i0 + grain));
}

/// Number of worker threads parallel_for may use.
inline int concurrency() {
#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
  return tbb::this_task_arena::max_concurrency();
#else
  return 1;
#endif
}

}  // namespace tightfit
