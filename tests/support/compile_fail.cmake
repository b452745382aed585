# A compile-must-fail check (in the manner of fmt's compile-error tests), run by ctest:
#   cmake -DCXX=<compiler> -DINCLUDE=<dir> -DSOURCE=<file.cpp> -DEXPECT=<regex> -P compile_fail.cmake
# 1. SOURCE compiled with -DTIGHTFIT_COMPILE_FAIL_CONTROL must succeed (the snippet is otherwise
#    correct, so the failure below is the one it was written for);
# 2. SOURCE compiled as is must fail, and the diagnostic must match EXPECT (the concept's name:
#    the error is reported at the seam, not deep inside the library).
foreach(var CXX INCLUDE SOURCE EXPECT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "compile_fail.cmake: -D${var}=... is required")
  endif()
endforeach()
set(flags -std=c++20 -fsyntax-only -I${INCLUDE})
execute_process(COMMAND ${CXX} ${flags} -DTIGHTFIT_COMPILE_FAIL_CONTROL ${SOURCE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE}: the control build (-DTIGHTFIT_COMPILE_FAIL_CONTROL) failed:\n${out}")
endif()
execute_process(COMMAND ${CXX} ${flags} ${SOURCE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE}: compiled, but it must be rejected")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "${SOURCE}: rejected, but the diagnostic does not name '${EXPECT}':\n${out}")
endif()
message(STATUS "${SOURCE}: rejected with '${EXPECT}' in the diagnostic")
