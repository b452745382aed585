// A fixture of the layering test: a concrete layer.
#pragma once
inline bool is_gemma(const char*) {
  return true;
}
