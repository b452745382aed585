// A fixture of the layering test: stream/ including a concrete layer and branching on an
// architecture (both must be reported).
#pragma once
#include "tightfit/nn/gemma_layer.hpp"
inline bool gemma(const char* a) {
  return is_gemma(a);
}
