# Build settings for tightfit's own tests, benches and examples (never exported).
add_library(tightfit_internal INTERFACE)
target_compile_options(tightfit_internal INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion
    -Wno-sign-conversion -Wnon-virtual-dtor -Wold-style-cast -Woverloaded-virtual>)
if(TIGHTFIT_WARNINGS_AS_ERRORS)
  target_compile_options(tightfit_internal INTERFACE $<$<CXX_COMPILER_ID:GNU,Clang>:-Werror>)
endif()
if(TIGHTFIT_SANITIZE)
  target_compile_options(tightfit_internal INTERFACE
    -fsanitize=${TIGHTFIT_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  target_link_options(tightfit_internal INTERFACE -fsanitize=${TIGHTFIT_SANITIZE})
endif()

# tightfit_add_executable(NAME SOURCES ... [LIBS ...]): an internal program with warnings.
function(tightfit_add_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE tightfit_internal tightfit::core ${ARG_LIBS})
endfunction()

# Eigen picks its SIMD kernels at compile time, and the compiler's default target is SSE2: built
# that way the kernels run 3-5x slower on an AVX2 / AVX-512 machine (docs/benchmarks.md). So
# tightfit's own programs (tests, benches, examples, the tool) are built for the building
# machine's instruction set when tightfit is the top-level project. Never exported: consumers
# and packagers choose their own flags (docs/architecture.md, "Compiler flags").
option(TIGHTFIT_NATIVE "Build tightfit's own programs with -march=native" ${PROJECT_IS_TOP_LEVEL})
if(TIGHTFIT_NATIVE)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-march=native TIGHTFIT_COMPILER_HAS_MARCH_NATIVE)
  if(TIGHTFIT_COMPILER_HAS_MARCH_NATIVE)
    # -Wno-maybe-uninitialized -Wno-uninitialized: GCC 12 reports false positives inside
    # avx512fintrin.h (_mm512_undefined_pd in _mm512_min_pd / _mm512_max_pd) when inlined through
    # Eigen's AVX-512 packet math (pexp_double); which translation units trip it depends on
    # inlining. The non-native builds (sanitizers, ThreadSanitizer) keep both warnings.
    target_compile_options(tightfit_internal INTERFACE -march=native
      $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized -Wno-uninitialized>)
  else()
    message(WARNING "TIGHTFIT_NATIVE: the compiler does not accept -march=native; building for its default target")
  endif()
endif()
