// tightfit/core/types.hpp: the index type and small vocabulary shared by every component.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tightfit {

/// Signed index type used for every extent, offset and stride (matches Eigen::Index).
using index_t = std::ptrdiff_t;

/// Token ids and labels follow the Hugging Face convention: 64-bit integers.
using token_id = std::int64_t;

/// A label equal to this value never contributes to a loss (Hugging Face / PyTorch convention).
inline constexpr token_id ignore_index = -100;

/// Transpose flag for BLAS-like kernels.
enum class transpose : bool { no = false, yes = true };

}  // namespace tightfit
