// A fixture of the layering test: dist/ includes optim/, which includes dist/.
#pragma once
#include "tightfit/optim/up.hpp"
