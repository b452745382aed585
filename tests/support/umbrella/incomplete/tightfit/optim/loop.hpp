// A fixture of the umbrella test: a header the umbrella includes.
#pragma once
