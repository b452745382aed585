// The tool's start-up check: was this binary compiled for the vector extensions the CPU has?
// Eigen chooses its SIMD kernels at compile time, so a build for the compiler's default target
// (SSE2) runs the GEMMs and attention 3-5x slower on an AVX2 / AVX-512 machine
// (docs/benchmarks.md, "Compiler flags"). The tool says so once, on stderr.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tightfit::cli {

/// The vector extensions this CPU has that the binary was not compiled for ("" when none),
/// e.g. "AVX2 FMA AVX-512".
inline std::string missing_vector_extensions() {
  std::string missing;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  auto note = [&](bool cpu_has, bool built_with, const char* name) {
    if (cpu_has && !built_with) missing += missing.empty() ? name : std::string(" ") + name;
  };
#if defined(__AVX2__)
  constexpr bool avx2 = true;
#else
  constexpr bool avx2 = false;
#endif
#if defined(__FMA__)
  constexpr bool fma = true;
#else
  constexpr bool fma = false;
#endif
#if defined(__AVX512F__)
  constexpr bool avx512 = true;
#else
  constexpr bool avx512 = false;
#endif
  __builtin_cpu_init();
  note(__builtin_cpu_supports("avx2"), avx2, "AVX2");
  note(__builtin_cpu_supports("fma"), fma, "FMA");
  note(__builtin_cpu_supports("avx512f"), avx512, "AVX-512");
#endif
  return missing;
}

/// Prints one line on stderr when the binary leaves vector extensions of this CPU unused
/// (unless TIGHTFIT_NO_CPU_WARNING is set: the CLI tests of a portable build set it).
inline void warn_if_built_without_cpu_extensions() {
  if (std::getenv("TIGHTFIT_NO_CPU_WARNING") != nullptr) return;
  const std::string missing = missing_vector_extensions();
  if (missing.empty()) return;
  std::fprintf(stderr,
               "tightfit: built without %s, which this CPU has: the kernels run about 3-5x slower "
               "(rebuild with -DTIGHTFIT_NATIVE=ON or -march=native; docs/benchmarks.md)\n",
               missing.c_str());
}

}  // namespace tightfit::cli
