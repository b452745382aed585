// tightfit/geometry/geometry.hpp: the geometry half of tightfit (umbrella header): point cloud
// concept, kd-tree, filters, belt plane, PCA, baseline boxes, MEBB, measure() with its status
// and uncertainty, PLY/XYZ I/O. (The suitcase scene generator of the tests and the benchmark lives
// in bench/geometry/scene.hpp, outside the installed library.)
#pragma once

#include "tightfit/geometry/box.hpp"
#include "tightfit/geometry/cloud_io.hpp"
#include "tightfit/geometry/filters.hpp"
#include "tightfit/geometry/kdtree.hpp"
#include "tightfit/geometry/measure.hpp"
#include "tightfit/geometry/mebb.hpp"
#include "tightfit/geometry/mebb_options.hpp"
#include "tightfit/geometry/pca.hpp"
#include "tightfit/geometry/plane.hpp"
#include "tightfit/geometry/point_cloud.hpp"
#include "tightfit/geometry/quality.hpp"
#include "tightfit/geometry/silhouette.hpp"
