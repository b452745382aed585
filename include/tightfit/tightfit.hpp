// tightfit/tightfit.hpp: the umbrella header. Includes every component whose dependencies are
// available to the including translation unit (Eigen, nanoflann, nlohmann-json are detected
// with __has_include).
#pragma once

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"
