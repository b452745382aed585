// A fixture of the layering test: optim/ and distributed/ include each other (must be reported).
#pragma once
#include "tightfit/distributed/down.hpp"
