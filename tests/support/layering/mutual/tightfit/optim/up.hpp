// A fixture of the layering test: optim/ and dist/ include each other (must be reported).
#pragma once
#include "tightfit/dist/down.hpp"
