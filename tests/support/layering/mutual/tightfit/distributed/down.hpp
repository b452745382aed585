// A fixture of the layering test: distributed/ includes optim/, which includes distributed/.
#pragma once
#include "tightfit/optim/up.hpp"
