// Tests of core/: errors, views, memory accounting, parallel_for.
#include <doctest/doctest.h>

#include <atomic>
#include <numeric>
#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/core/view.hpp"

using namespace tightfit;

TEST_CASE("check_extent names the value and the expected one") {
  try {
    check_extent("kernel", "x.rows", index_t{7}, index_t{8});
    FAIL("no throw");
  } catch (const error& e) {
    CHECK(std::string(e.what()) == "kernel: x.rows is 7, expected 8");
  }
  CHECK_NOTHROW(check_extent("kernel", "x.rows", index_t{8}, index_t{8}));
}

TEST_CASE("matrix_view indexing, sub-views and reshape") {
  std::vector<double> data(12);
  std::iota(data.begin(), data.end(), 0.0);
  matrix_view<double> m(data.data(), 3, 4);
  CHECK(m(2, 3) == 11.0);
  auto sub = m.row_range(1, 3).col_range(1, 3);
  CHECK(sub.rows == 2);
  CHECK(sub.cols == 2);
  CHECK(sub(1, 1) == 10.0);
  CHECK_FALSE(sub.contiguous());
  CHECK_THROWS_AS(sub.reshape(1, 4), error);
  auto r = m.reshape(6, 2);
  CHECK(r(5, 1) == 11.0);
  CHECK_THROWS_AS(m.reshape(5, 2), error);
  matrix_view<const double> c = m;
  CHECK(c(1, 0) == 4.0);
  tensor3_view<double> t(data.data(), 2, 3, 2);
  CHECK(t(1, 2, 1) == 11.0);
  CHECK(t[1](0, 0) == 6.0);
}

TEST_CASE("memory_counter counts live and peak bytes, peak_scope nests") {
  memory_counter counter;
  {
    host_buffer<double> a(counter, 10);
    CHECK(counter.live() == 80);
    CHECK(a.span()[3] == 0.0);
    {
      peak_scope scope(counter);
      host_buffer<float> b(counter, 100);
      CHECK(scope.peak_above_entry() == 400);
      b.reset();
      CHECK(counter.live() == 80);
      host_buffer<float> c(counter, 50);
      CHECK(scope.peak_bytes() == 480);
      CHECK(scope.peak_above_entry() == 400);
    }
    host_buffer<double> moved = std::move(a);
    CHECK(counter.live() == 80);
  }
  CHECK(counter.live() == 0);
  CHECK(counter.peak() == 480);
  CHECK(counter.allocations() == 3);
  CHECK_THROWS_AS(host_buffer<double>(counter, -1), error);
}

TEST_CASE("parallel_for covers every index_t exactly once") {
  std::vector<std::atomic<int>> hits(1003);
  parallel_for(0, 1003, 17, [&](index_t i0, index_t i1) {
    for (index_t i = i0; i < i1; ++i) hits[static_cast<std::size_t>(i)]++;
  });
  for (auto& h : hits) CHECK(h.load() == 1);
  int calls = 0;
  parallel_for(5, 5, 1, [&](index_t, index_t) { ++calls; });
  CHECK(calls == 0);
}
