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
