// tightfit/backend/detail/thread_arena.hpp: the worker threads a backend owns. With oneTBB
// (TIGHTFIT_HAS_TBB) it is a tbb::task_arena of the requested size: every parallel_for a kernel
// runs inside run() uses this arena's workers, not the global pool, so two backends (or a backend
// and the application) do not compete for one pool. Without TBB, run() calls the function
// directly (the std::thread and serial builds of core/parallel.hpp size themselves).
#pragma once

#include <memory>

#include "tightfit/core/error.hpp"
#include "tightfit/core/parallel.hpp"

#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
#include <tbb/task_arena.h>
#endif

namespace tightfit::detail {

class thread_arena {
 public:
  /// threads: worker threads (>= 1), or 0 for one per core.
  explicit thread_arena(int threads) {
    check(threads >= 0, "thread_arena: threads is ", threads, ", expected >= 0 (0: all cores)");
#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
    // automatic is a static data member: read it as a value (not bound to a reference).
    const int slots = threads > 0 ? threads : static_cast<int>(tbb::task_arena::automatic);
    arena_ = std::make_unique<tbb::task_arena>(slots);
#endif
  }
  /// Runs f() with this arena's workers (exceptions propagate to the caller).
  template <class F>
  void run(F&& f) {
#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
    arena_->execute(f);
#else
    f();
#endif
  }
  /// Worker threads the kernels may use.
  int threads() {
    int n = 0;
    run([&] { n = concurrency(); });
    return n;
  }

 private:
#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
  std::unique_ptr<tbb::task_arena> arena_;
#endif
};

}  // namespace tightfit::detail
