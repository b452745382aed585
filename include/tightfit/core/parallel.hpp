// tightfit/core/parallel.hpp: a parallel-for over oneTBB, over std::thread, or serial.
//
// Three builds, chosen by the tightfit::tbb CMake target:
//  - TIGHTFIT_HAS_TBB=1: oneTBB's work-stealing pool (the default when TBB is found).
//  - TIGHTFIT_HAS_STD_THREADS=1 (TBB off): each parallel_for starts up to concurrency() - 1
//    std::threads that take ranges from a shared counter. Slower to start than a pool; it exists
//    so that ThreadSanitizer sees every concurrent access (Debian's TBB is not instrumented).
//  - neither: every loop runs serially on the calling thread.
// Results are identical in all three (each index range is processed by the same body); only the
// order in which ranges run differs. `per_worker<T>` gives each worker its own T (partial sums).
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "tightfit/core/types.hpp"

#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#elif defined(TIGHTFIT_HAS_STD_THREADS) && TIGHTFIT_HAS_STD_THREADS
#include <atomic>
#include <exception>
#include <thread>
#define TIGHTFIT_PARALLEL_STD_THREADS 1
#endif

namespace tightfit {

/// Number of worker threads parallel_for may use.
inline int concurrency() {
#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
  return tbb::this_task_arena::max_concurrency();
#elif defined(TIGHTFIT_PARALLEL_STD_THREADS)
  // At least two workers, so that the concurrent code paths run even on a one-core machine.
  return static_cast<int>(std::max(2U, std::thread::hardware_concurrency()));
#else
  return 1;
#endif
}

/// Calls body(i0, i1) on disjoint ranges covering [begin, end), each at most `grain` long
/// when run serially, possibly concurrently when TBB or std::thread parallelism is enabled.
/// An exception thrown by a body is rethrown on the calling thread.
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
#elif defined(TIGHTFIT_PARALLEL_STD_THREADS)
  const index_t ranges = (end - begin + grain - 1) / grain;
  const index_t workers = std::min<index_t>(ranges, concurrency());
  if (workers > 1) {
    std::atomic<index_t> next{0};
    std::exception_ptr failure;
    std::mutex failure_mutex;
    auto work = [&] {
      try {
        for (index_t r = next.fetch_add(1); r < ranges; r = next.fetch_add(1)) {
          const index_t i0 = begin + r * grain;
          body(i0, std::min(end, i0 + grain));
        }
      } catch (...) {
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        next.store(ranges);  // the others stop after their current range
      }
    };
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(workers - 1));
    for (index_t w = 1; w < workers; ++w) threads.emplace_back(work);
    work();
    for (auto& thread : threads) thread.join();
    if (failure) std::rethrow_exception(failure);
    return;
  }
#endif
  for (index_t i0 = begin; i0 < end; i0 += grain) body(i0, std::min(end, i0 + grain));
}

/// One T per worker thread that asks for it (created by `make` on the worker's first local()),
/// e.g. a partial sum that the workers of a parallel_for add into without contention; then
/// for_each visits every instance that was created, on the calling thread.
template <class T>
class per_worker {
 public:
  template <class Make>
      explicit per_worker(Make make)
#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
      : items_(std::move(make)){}
#else
      : make_(std::move(make)) {
  }
#endif

        /// The calling worker's instance.
        T
        &
        local() {
#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
    return items_.local();
#elif defined(TIGHTFIT_PARALLEL_STD_THREADS)
    const auto id = std::this_thread::get_id();
    const std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [owner, item] : items_)
      if (owner == id) return *item;
    items_.emplace_back(id, std::make_unique<T>(make_()));
    return *items_.back().second;
#else
    if (items_.empty()) items_.push_back(std::make_unique<T>(make_()));
    return *items_.front();
#endif
  }

  /// Calls f(item) for every instance created so far (not concurrently with local()).
  template <class F>
  void for_each(F&& f) {
#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
    for (auto& item : items_) f(item);
#elif defined(TIGHTFIT_PARALLEL_STD_THREADS)
    for (auto& entry : items_) f(*entry.second);
#else
    for (auto& item : items_) f(*item);
#endif
  }

 private:
#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
  tbb::enumerable_thread_specific<T> items_;
#elif defined(TIGHTFIT_PARALLEL_STD_THREADS)
  std::function<T()> make_;
  std::mutex mutex_;
  std::vector<std::pair<std::thread::id, std::unique_ptr<T>>> items_;
#else
  std::function<T()> make_;
  std::vector<std::unique_ptr<T>> items_;
#endif
};

}  // namespace tightfit
