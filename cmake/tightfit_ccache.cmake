# ccache for tightfit's own builds (TIGHTFIT_CCACHE, on when tightfit is the top-level project):
# when ccache is installed and the user chose no launcher, C++ and CUDA sources compile through it.
# base_dir is the source tree, so that two checkouts (worktrees, CI's clean clone) share cache
# entries; the cache itself is ccache's default (~/.cache/ccache), which persists across builds.
if(NOT TIGHTFIT_CCACHE)
  return()
endif()
find_program(TIGHTFIT_CCACHE_PROGRAM ccache)
if(NOT TIGHTFIT_CCACHE_PROGRAM)
  message(STATUS "tightfit: ccache not found, compiling without it (scripts/deps installs it)")
  return()
endif()
set(_tightfit_launcher ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}
  CCACHE_NOHASHDIR=1 ${TIGHTFIT_CCACHE_PROGRAM})
if(NOT DEFINED CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_tightfit_launcher})
endif()
if(NOT DEFINED CMAKE_CUDA_COMPILER_LAUNCHER)
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${_tightfit_launcher})
endif()
message(STATUS "tightfit: compiling through ${TIGHTFIT_CCACHE_PROGRAM}")
