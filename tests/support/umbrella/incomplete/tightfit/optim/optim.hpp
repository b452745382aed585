// A fixture of the umbrella test: an umbrella that leaves out optim/rules.hpp (must be reported).
#pragma once
#include "tightfit/optim/loop.hpp"
