// A fixture of the layering test: a header on floor 0.
#pragma once
