// bench_read: what reading a large input by position (pread, the library's readers since issue 35)
// costs against reading it through a memory mapping, unprotected (before) or with a SIGBUS handler
// and sigsetjmp around every read (the other way to survive a file truncated under the reader).
// Files on a warm page cache: a 64 MiB F32 tensor read as float, a 32 MiB BF16 tensor converted to
// float, and a 4 M-point float PLY read as a float_cloud (48 MiB).
//   bench_read --benchmark_min_time=0.5 [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "tightfit/geometry/cloud_io.hpp"
#include "tightfit/io/detail/half.hpp"
#include "tightfit/io/safetensors.hpp"

namespace {

namespace fs = std::filesystem;

const fs::path dir =
    fs::temp_directory_path() / ("tightfit_bench_read_" + std::to_string(getpid()));
constexpr std::size_t f32_elements = std::size_t{16} << 20;   // 64 MiB
constexpr std::size_t bf16_elements = std::size_t{16} << 20;  // 32 MiB
constexpr std::size_t ply_points = std::size_t{4} << 20;      // 48 MiB of float x, y, z

fs::path st_path() {
  return dir / "read.safetensors";
}
fs::path ply_path() {
  return dir / "read.ply";
}

void make_files() {
  static std::once_flag once;
  std::call_once(once, [] {
    fs::create_directories(dir);
    std::vector<float> a(f32_elements);
    std::vector<double> b(bf16_elements);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 1000) * 0.5f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<double>(i % 777) * 0.25;
    tightfit::safetensors_writer w;
    w.add("f32", {static_cast<tightfit::index_t>(a.size())}, std::span<const float>(a));
    w.add("bf16", {static_cast<tightfit::index_t>(b.size())}, std::span<const double>(b),
          tightfit::dtype::bf16);
    w.write(st_path());
    std::ofstream out(ply_path(), std::ios::binary);
    out << "ply\nformat binary_little_endian 1.0\nelement vertex " << ply_points
        << "\nproperty float x\nproperty float y\nproperty float z\nend_header\n";
    std::vector<float> xyz(3 * ply_points);
    for (std::size_t i = 0; i < xyz.size(); ++i) xyz[i] = static_cast<float>(i % 4093) * 1e-3f;
    out.write(reinterpret_cast<const char*>(xyz.data()),
              static_cast<std::streamsize>(xyz.size() * 4));
  });
}

// The SIGBUS alternative: a process-wide handler that jumps back to the innermost guarded read of
// the faulting thread (thread_local), installed once; a fault outside a guard re-raises.
thread_local sigjmp_buf* guard_jump = nullptr;
struct sigaction previous_bus {};
void on_sigbus(int sig, siginfo_t*, void*) {
  if (guard_jump != nullptr) siglongjmp(*guard_jump, 1);
  sigaction(SIGBUS, &previous_bus, nullptr);
  raise(sig);
}
void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &previous_bus);
  });
}
// Runs f() under the guard; false when a SIGBUS interrupted it.
template <class F>
bool guarded(F&& f) {
  sigjmp_buf env;
  sigjmp_buf* outer = guard_jump;
  if (sigsetjmp(env, 1) != 0) {
    guard_jump = outer;
    return false;
  }
  guard_jump = &env;
  f();
  guard_jump = outer;
  return true;
}

struct mapping {
  const std::byte* data = nullptr;
  std::size_t size = 0;
  explicit mapping(const fs::path& p) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    ::fstat(fd, &st);
    size = static_cast<std::size_t>(st.st_size);
    data = static_cast<const std::byte*>(::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0));
    ::close(fd);
  }
  ~mapping() { ::munmap(const_cast<std::byte*>(data), size); }
};

// Reads tensors "f32" (as float) and "bf16" (converted to float) from a mapping of the file,
// with or without the guard (the header parsed by the library from the mapped bytes).
void safetensors_mapped(benchmark::State& state, bool guard) {
  make_files();
  if (guard) install_sigbus_handler();
  std::vector<float> a(f32_elements), b(bf16_elements);
  for (auto _ : state) {
    const mapping m(st_path());
    const auto view = tightfit::safetensors_view::parse({m.data, m.size}, st_path().string());
    auto read = [&] {
      view.read<float>("f32", std::span<float>(a));
      view.read<float>("bf16", std::span<float>(b));
    };
    if (guard) {
      if (!guarded(read)) state.SkipWithError("SIGBUS");
    } else {
      read();
    }
    benchmark::DoNotOptimize(a.data());
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(4 * f32_elements + 2 * bf16_elements));
}

// The library's reader: pread, 1 MiB blocks for conversions, straight into the output for F32.
void safetensors_pread(benchmark::State& state) {
  make_files();
  std::vector<float> a(f32_elements), b(bf16_elements);
  for (auto _ : state) {
    const auto f = tightfit::safetensors_file::open(st_path());
    f.read<float>("f32", std::span<float>(a));
    f.read<float>("bf16", std::span<float>(b));
    benchmark::DoNotOptimize(a.data());
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(4 * f32_elements + 2 * bf16_elements));
}

// A float PLY: viewed in place in a mapping (before issue 35: no copy, unprotected), copied out
// of a mapping under the guard, or read by position (the library now).
void ply_mapped_view(benchmark::State& state) {
  make_files();
  for (auto _ : state) {
    auto m = std::make_shared<mapping>(ply_path());
    const auto c = tightfit::geometry::read_ply_stored(
        std::span<const char>(reinterpret_cast<const char*>(m->data), m->size), m,
        ply_path().string());
    benchmark::DoNotOptimize(&c);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(12 * ply_points));
}
void ply_mapped_guarded_copy(benchmark::State& state) {
  make_files();
  install_sigbus_handler();
  for (auto _ : state) {
    const mapping m(ply_path());
    tightfit::geometry::stored_cloud c;
    const bool ok = guarded([&] {
      c = tightfit::geometry::read_ply_stored(
          std::span<const char>(reinterpret_cast<const char*>(m.data), m.size), nullptr,
          ply_path().string());
      // the view must not outlive the guard: copy the coordinates out
      const auto& v = std::get<tightfit::geometry::float_cloud>(c);
      std::vector<float> xyz(3 * v.kdtree_get_point_count());
      for (std::size_t i = 0; i < v.kdtree_get_point_count(); ++i)
        for (std::size_t d = 0; d < 3; ++d) xyz[3 * i + d] = v.coord(i, d);
      c = tightfit::geometry::float_cloud(std::move(xyz));
    });
    if (!ok) state.SkipWithError("SIGBUS");
    benchmark::DoNotOptimize(&c);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(12 * ply_points));
}
void ply_pread(benchmark::State& state) {
  make_files();
  for (auto _ : state) {
    const auto c = tightfit::geometry::read_cloud_stored(ply_path().string());
    benchmark::DoNotOptimize(&c);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(12 * ply_points));
}

}  // namespace

BENCHMARK_CAPTURE(safetensors_mapped, unprotected, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(safetensors_mapped, sigbus_guard, true)->Unit(benchmark::kMillisecond);
BENCHMARK(safetensors_pread)->Unit(benchmark::kMillisecond);
BENCHMARK(ply_mapped_view)->Unit(benchmark::kMillisecond);
BENCHMARK(ply_mapped_guarded_copy)->Unit(benchmark::kMillisecond);
BENCHMARK(ply_pread)->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
