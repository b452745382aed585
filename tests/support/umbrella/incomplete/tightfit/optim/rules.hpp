// A fixture of the umbrella test: a header the umbrella leaves out.
#pragma once
