# scripts/check-options passes on the tree (the library, the tool, tests, benches, bindings), fails on each snippet that takes an
# options struct by value (naming the file, line and parameter) and passes on one that takes
# them every allowed way (const T&, east const, an out-parameter, a pointer, the name in a comment,
# a string, a call or a local variable).
#   cmake -DROOT=<source dir> -DWORK=<scratch dir> -P check_options_test.cmake
if(NOT DEFINED ROOT OR NOT DEFINED WORK)
  message(FATAL_ERROR "check_options_test.cmake: -DROOT=<dir> and -DWORK=<dir> are required")
endif()
set(script ${ROOT}/scripts/check-options)
set(failures "")

# run(NAME EXPECT_RC EXPECT_OUTPUT PATH): runs the script on PATH
function(run name expect_rc expect_output path)
  execute_process(COMMAND ${script} ${path} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL expect_rc)
    string(APPEND failures "  ${name}: exit ${rc}, expected ${expect_rc}\n${out}${err}")
  elseif(NOT "${out}${err}" MATCHES "${expect_output}")
    string(APPEND failures "  ${name}: output does not match '${expect_output}':\n${out}${err}")
  endif()
  set(failures "${failures}" PARENT_SCOPE)
endfunction()

foreach(part include examples tests bench python fuzz)
  if(EXISTS ${ROOT}/${part})
    run(tree_${part} 0 "every options parameter by const reference" ${ROOT}/${part})
  endif()
endforeach()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
# bad(NAME LINE PARAM TEXT): TEXT takes PARAM by value or by T&& on line LINE
function(bad name line param text)
  file(WRITE ${WORK}/${name}.hpp "${text}")
  run(${name} 1 "${name}.hpp:${line}: parameter '${param}' takes [a-z_:]+ by" ${WORK}/${name}.hpp)
  set(failures "${failures}" PARENT_SCOPE)
endfunction()
bad(by_value 2 o "#include <x>\ninline void f(const int& x, mebb_options o = {}) {}\n")
bad(const_value 1 o "void f(const block_options o);\n")
bad(qualified 3 opts
    "template <class B>\nvoid g(B& b,\n       tightfit::geometry::mebb_options\n           opts);\n")
bad(rvalue 1 o "void h(train_options&& o);\n")
bad(listed 2 belt "// belt_choice is measure()'s belt option\nvoid m(belt_choice belt = {});\n")
bad(constructor 2 options "struct backend {\n  explicit backend(eigen_backend_options options = {});\n};\n")
bad(after_comment 1 o "void f(/* the options */ head_options o);\n")

file(WRITE ${WORK}/good.hpp [=[
// a comment naming f(mebb_options o) is no parameter
void a(const mebb_options& o, mebb_options const& p, const tightfit::geometry::mebb_options &q);
void b(train_options& out, const block_options* maybe = nullptr);
inline const char* c() { return "g(mebb_options o)"; }
inline void d(const backward_options& base) {
  step(x, lora_backward_options(base));
  mebb_options copy = base_options;
  copy.voxel = 1;
}
struct e {
  mebb_options o;
};
]=])
run(good 0 "1 files, every options parameter" ${WORK}/good.hpp)
run(missing 2 "no_such_file.hpp' does not exist" ${WORK}/no_such_file.hpp)

if(failures)
  message(FATAL_ERROR "scripts/check-options:\n${failures}")
endif()
message(STATUS "scripts/check-options: the tree passes, 7 bad snippets fail, the good one passes")
