# The layering of the library, checked on the #include lines of every header (run by ctest).
# Every folder of include/tightfit stands on a floor and includes only itself and folders on
# lower floors, so no two folders include each other:
#   floor 0  core/
#   floor 1  backend/, io/, loss/, geometry/   (core/ only: file formats, objectives and point
#            clouds know no model and no backend)
#   floor 2  nn/        the layers and models (nn/hf_model.hpp, nn/peft.hpp read io/)
#   floor 3  stream/    the gradient schedules, the head, the planner
#   floor 4  dist/      communicators, data- and sequence-parallel gradients
#   floor 5  optim/     optimizers (ZeRO-1 included) and the training loop
#   top      tightfit.hpp, the umbrella header (may include anything)
# A folder without a floor is a violation (a new folder gets its rule here). Besides:
#   optim/, dist/, stream/ include neither io/ nor a concrete objective (loss/ other than
#   objective.hpp): the training loop and the planner take the objective as a parameter,
#   checkpoints go through a writer concept;
#   stream/ includes no concrete layer (nn/decoder_layer.hpp, nn/gemma_layer.hpp) and branches on
#   no architecture (is_gemma): the architecture facts are model_config's, the layer a config
#   names is nn/architectures.hpp's;
#   no header cites ALGORITHMS.md (a design note outside the repository: notes live in docs/).
# The check also fails when two folders include each other (reported as such).
#   cmake -DINCLUDE=<include dir> [-DMIN_HEADERS=n] -P check_layering.cmake
# (MIN_HEADERS, default 20: fewer headers found is an error, e.g. a wrong INCLUDE.)
cmake_policy(SET CMP0057 NEW)  # if(... IN_LIST ...)
if(NOT DEFINED INCLUDE)
  message(FATAL_ERROR "check_layering.cmake: -DINCLUDE=<dir> is required")
endif()
if(NOT DEFINED MIN_HEADERS)
  set(MIN_HEADERS 20)
endif()
set(floor_core 0)
set(floor_backend 1)
set(floor_io 1)
set(floor_loss 1)
set(floor_geometry 1)
set(floor_nn 2)
set(floor_stream 3)
set(floor_dist 4)
set(floor_optim 5)
file(GLOB_RECURSE headers RELATIVE ${INCLUDE}/tightfit ${INCLUDE}/tightfit/*.hpp
     ${INCLUDE}/tightfit/*.cuh)
set(violations "")
set(edges "")
set(count 0)
foreach(h IN LISTS headers)
  math(EXPR count "${count} + 1")
  if(NOT h MATCHES "/")
    set(top "")  # tightfit.hpp: the umbrella
  else()
    string(REGEX MATCH "^[^/]+" top "${h}")
    if(NOT DEFINED floor_${top})
      string(APPEND violations "  tightfit/${top}/ has no floor in check_layering.cmake\n")
    endif()
  endif()
  file(STRINGS ${INCLUDE}/tightfit/${h} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"tightfit/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"tightfit/([^\"]+)\".*" "\\1" inc "${line}")
    if(NOT inc MATCHES "/")
      string(APPEND violations "  tightfit/${h} includes the umbrella tightfit/${inc}\n")
      continue()
    endif()
    string(REGEX MATCH "^[^/]+" dir "${inc}")
    if(top STREQUAL "" OR dir STREQUAL top)
      continue()
    endif()
    list(APPEND edges "${top}>${dir}")
    set(bad "")
    if(NOT DEFINED floor_${dir})
      set(bad "${dir}/ has no floor")
    elseif(DEFINED floor_${top} AND NOT floor_${dir} LESS floor_${top})
      set(bad "${top}/ (floor ${floor_${top}}) may include only lower floors, ${dir}/ is on floor ${floor_${dir}}")
    elseif(top MATCHES "^(optim|dist|stream)$" AND dir STREQUAL "io")
      set(bad "${top}/ may not include io/")
    elseif(top MATCHES "^(optim|dist|stream)$" AND dir STREQUAL "loss" AND NOT inc STREQUAL "loss/objective.hpp")
      set(bad "${top}/ may not include a concrete objective")
    elseif(top STREQUAL "stream" AND inc MATCHES "^nn/(decoder_layer|gemma_layer)\\.hpp$")
      set(bad "stream/ may not include a concrete layer")
    endif()
    if(bad)
      string(APPEND violations "  tightfit/${h} includes tightfit/${inc}: ${bad}\n")
    endif()
  endforeach()
  if(top STREQUAL "stream")
    file(STRINGS ${INCLUDE}/tightfit/${h} branches REGEX "is_gemma")
    if(branches)
      string(APPEND violations "  tightfit/${h} branches on an architecture (is_gemma): use model_config's facts\n")
    endif()
  endif()
  file(STRINGS ${INCLUDE}/tightfit/${h} cites REGEX "ALGORITHMS\\.md")
  if(cites)
    string(APPEND violations "  tightfit/${h} cites ALGORITHMS.md (not in the repository: cite docs/)\n")
  endif()
endforeach()
# Two folders that include each other (whatever their floors say).
list(REMOVE_DUPLICATES edges)
foreach(edge IN LISTS edges)
  string(REPLACE ">" ";" pair "${edge}")
  list(GET pair 0 a)
  list(GET pair 1 b)
  if("${b}>${a}" IN_LIST edges AND a STRLESS b)
    string(APPEND violations "  tightfit/${a}/ and tightfit/${b}/ include each other\n")
  endif()
endforeach()
if(count LESS MIN_HEADERS)
  message(FATAL_ERROR "check_layering.cmake: only ${count} headers found under ${INCLUDE}/tightfit")
endif()
if(violations)
  message(FATAL_ERROR "layering violations:\n${violations}")
endif()
message(STATUS "${count} headers: layering holds")
