// tightfit/geometry/kdtree.hpp: a kd-tree over a PointCloud (nanoflann), for radius and k-nearest
// searches.
//
// Works with Debian's nanoflann 1.4.3 (SearchParams, pair results) and with nanoflann >= 1.5
// (SearchParameters, ResultItem): the version-dependent names are chosen on NANOFLANN_VERSION and
// the results are returned in tightfit's own form (indices, squared distances), unsorted for
// radius searches. The tree keeps a reference to the cloud, which must outlive it.
#pragma once

#include <cstddef>
#include <memory>
#include <nanoflann.hpp>
#include <vector>

#include "tightfit/geometry/point_cloud.hpp"

namespace tightfit::geometry {

namespace detail {
#if NANOFLANN_VERSION >= 0x150
using search_params = nanoflann::SearchParameters;
#else
using search_params = nanoflann::SearchParams;
#endif

// nanoflann needs kdtree_get_bbox as well; PointCloud does not ask the user for it.
template <PointCloud C>
struct dataset_adaptor {
  const C& cloud;
  std::size_t kdtree_get_point_count() const { return cloud.kdtree_get_point_count(); }
  double kdtree_get_pt(std::size_t i, std::size_t d) const {
    return static_cast<double>(cloud.kdtree_get_pt(i, d));
  }
  template <class Bbox>
  bool kdtree_get_bbox(Bbox& /*bb*/) const {
    return false;
  }
};

// A radius result set that appends indices without sorting (the same members as nanoflann's).
struct index_collector {
  double radius_sq;
  std::vector<std::size_t>* out;
  std::size_t size() const { return out->size(); }
  bool full() const { return true; }
  bool addPoint(double dist, std::size_t index) {
    if (dist < radius_sq) out->push_back(index);
    return true;
  }
  double worstDist() const { return radius_sq; }
  void init() {}
  void clear() { out->clear(); }
};
}  // namespace detail

/// A 3D kd-tree over a PointCloud (Euclidean distance, double precision).
template <PointCloud C>
class kd_tree {
  using adaptor = detail::dataset_adaptor<C>;
  using index_type =
      nanoflann::KDTreeSingleIndexAdaptor<nanoflann::L2_Simple_Adaptor<double, adaptor>, adaptor, 3,
                                          std::size_t>;

 public:
  /// Builds the tree; `leaf_size` is nanoflann's leaf_max_size.
  explicit kd_tree(const C& cloud, std::size_t leaf_size = 16)
      : adaptor_{cloud},
        index_(std::make_unique<index_type>(
            3, adaptor_, nanoflann::KDTreeSingleIndexAdaptorParams(leaf_size))) {}

  /// Number of indexed points.
  std::size_t size() const { return adaptor_.kdtree_get_point_count(); }

  /// Indices of the points strictly within `radius` of `q` (unsorted) into `out` (cleared first).
  void radius(const point3& q, double radius, std::vector<std::size_t>& out) const {
    out.clear();
    if (size() == 0) return;
    detail::index_collector rs{radius * radius, &out};
    index_->findNeighbors(rs, q.data(), detail::search_params{});
  }

  /// The k nearest neighbours of `q` (nearest first): indices and squared distances; returns
  /// how many were found (fewer than k only when the cloud is smaller).
  std::size_t knn(const point3& q, std::size_t k, std::size_t* idx, double* dist_sq) const {
    if (size() == 0 || k == 0) return 0;
    nanoflann::KNNResultSet<double, std::size_t> rs(k);
    rs.init(idx, dist_sq);
    index_->findNeighbors(rs, q.data(), detail::search_params{});
    return rs.size();
  }

 private:
  adaptor adaptor_;
  std::unique_ptr<index_type> index_;
};

/// A kd-tree over a `points` vector (the tree references `p`, which must outlive it).
class points_tree {
 public:
  explicit points_tree(const points& p, std::size_t leaf_size = 16)
      : cloud_(p), tree_(cloud_, leaf_size) {}
  points_tree(const points_tree&) = delete;  // the tree references cloud_
  points_tree& operator=(const points_tree&) = delete;
  std::size_t size() const { return tree_.size(); }
  void radius(const point3& q, double r, std::vector<std::size_t>& out) const {
    tree_.radius(q, r, out);
  }
  std::size_t knn(const point3& q, std::size_t k, std::size_t* idx, double* dist_sq) const {
    return tree_.knn(q, k, idx, dist_sq);
  }

 private:
  vector_cloud<point3> cloud_;
  kd_tree<vector_cloud<point3>> tree_;
};

}  // namespace tightfit::geometry
