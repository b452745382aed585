// A fixture of the layering test: a folder without a floor (must be reported).
#pragma once
#include "tightfit/core/base.hpp"
