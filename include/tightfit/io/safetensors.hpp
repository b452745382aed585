// tightfit/io/safetensors.hpp: reading and writing the safetensors format (Hugging Face).
//
// Format (https://github.com/huggingface/safetensors): 8 bytes little-endian header length N,
// N bytes of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
// "__metadata__": {"k": "v"}}, then the data area; offsets are relative to the data area and
// tensors are stored row-major, little-endian.
//
// The header is UNTRUSTED input. safetensors_view::parse checks, before anything is read:
// N bounded by the file size and by 100 MB; the JSON well formed (UTF-8), an object, nested
// at most as deep as the format needs, no duplicate names or keys; every entry has a known
// dtype, a shape of non-negative integers whose element count and byte size do not overflow,
// data_offsets [b, e] with b <= e <= data size and e - b == bytes of the shape; tensors do not
// overlap. Every violation throws tightfit::error naming the file, the tensor and the problem.
// After parse, every read stays inside the byte range of its tensor.
//
// safetensors_file reads the file by position (io/detail/file_reader.hpp: pread, never mmap), so
// a file truncated by another process while it is read ends in a tightfit::error naming it, never
// in SIGBUS; each read converts at most 1 MiB at a time (same-type reads go straight into the
// destination).
//
// Widening conversions are exact; narrowing ones round to nearest even (detail/half.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/io/detail/file_reader.hpp"
#include "tightfit/io/detail/half.hpp"

namespace tightfit {

/// Element types of the safetensors format (the ones tightfit knows the size of).
enum class dtype : std::uint8_t {
  boolean,  ///< BOOL (1 byte, 0 or 1)
  u8,
  i8,
  i16,
  u16,
  f16,   ///< IEEE binary16
  bf16,  ///< bfloat16
  i32,
  u32,
  f32,
  i64,
  u64,
  f64,
  f8_e4m3,  ///< known (files holding it open) but not convertible
  f8_e5m2,  ///< known (files holding it open) but not convertible
};

/// The safetensors name of a dtype ("F32", "BF16", ...).
inline const char* dtype_name(dtype t) {
  switch (t) {
    case dtype::boolean:
      return "BOOL";
    case dtype::u8:
      return "U8";
    case dtype::i8:
      return "I8";
    case dtype::i16:
      return "I16";
    case dtype::u16:
      return "U16";
    case dtype::f16:
      return "F16";
    case dtype::bf16:
      return "BF16";
    case dtype::i32:
      return "I32";
    case dtype::u32:
      return "U32";
    case dtype::f32:
      return "F32";
    case dtype::i64:
      return "I64";
    case dtype::u64:
      return "U64";
    case dtype::f64:
      return "F64";
    case dtype::f8_e4m3:
      return "F8_E4M3";
    case dtype::f8_e5m2:
      return "F8_E5M2";
  }
  return "?";
}

/// Bytes per element.
inline std::size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::boolean:
    case dtype::u8:
    case dtype::i8:
    case dtype::f8_e4m3:
    case dtype::f8_e5m2:
      return 1;
    case dtype::i16:
    case dtype::u16:
    case dtype::f16:
    case dtype::bf16:
      return 2;
    case dtype::i32:
    case dtype::u32:
    case dtype::f32:
      return 4;
    case dtype::i64:
    case dtype::u64:
    case dtype::f64:
      return 8;
  }
  return 0;
}

/// The dtype named `name` ("F32", ...), or nullopt when unknown.
inline std::optional<dtype> parse_dtype(std::string_view name) {
  for (int i = 0; i <= static_cast<int>(dtype::f8_e5m2); ++i) {
    const auto t = static_cast<dtype>(i);
    if (name == dtype_name(t)) return t;
  }
  return std::nullopt;
}

/// True for F64, F32, BF16 and F16 (readable as float / double).
inline bool is_floating(dtype t) {
  return t == dtype::f64 || t == dtype::f32 || t == dtype::bf16 || t == dtype::f16;
}

/// One tensor of a safetensors file.
struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  std::vector<index_t> shape;  ///< row-major extents, each >= 0
  std::uint64_t begin = 0;     ///< byte offsets in the data area: [begin, end)
  std::uint64_t end = 0;

  /// Number of elements (product of the extents; 1 for a scalar).
  index_t numel() const {
    index_t n = 1;
    for (index_t e : shape) n *= e;
    return n;
  }
};

namespace io::detail {

inline constexpr std::uint64_t max_header_bytes = 100'000'000;  // as the reference reader

inline std::string shape_string(std::span<const index_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

template <class U>
U load_le(const std::byte* p) {
  U v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) {
    U r = 0;
    for (std::size_t i = 0; i < sizeof v; ++i)
      r = static_cast<U>((r << 8) | ((v >> (8 * i)) & 0xffu));
    v = r;
  }
  return v;
}

template <class U>
void store_le(U v, std::byte* p) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, &v, sizeof v);
  } else {
    for (std::size_t i = 0; i < sizeof v; ++i)
      p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xffu);
  }
}

/// a * b, or nullopt on overflow of uint64.
inline std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

/// A non-negative JSON integer, or an error "<where> is <value>, expected <what>".
inline std::uint64_t json_uint(const nlohmann::json& v, const std::string& where,
                               const char* what) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer())
    fail(where, " is negative (", v.get<std::int64_t>(), "), expected ", what);
  fail(where, " is ", v.dump(), ", expected ", what);
}

}  // namespace io::detail

/// A parsed safetensors image in memory (non-owning): the header validated, the data area
/// addressed by name. safetensors_file owns the memory; the fuzzer parses raw bytes with it.
class safetensors_view {
 public:
  safetensors_view() = default;

  /// Parses and validates the header of the safetensors image `file`. `source` names the file
  /// in error messages. The bytes must outlive the view.
  static safetensors_view parse(std::span<const std::byte> file, std::string source = "<memory>") {
    const std::uint64_t n =
        header_length(file.first(std::min<std::size_t>(8, file.size())), file.size(), source);
    safetensors_view v =
        parse_header(std::span<const std::byte>(file.data() + 8, static_cast<std::size_t>(n)),
                     file.size() - 8 - n, std::move(source));
    v.data_ = file.subspan(8 + static_cast<std::size_t>(n));
    return v;
  }

 protected:
  /// The header length N from the first 8 bytes of a file of `file_size` bytes, checked.
  static std::uint64_t header_length(std::span<const std::byte> first8, std::uint64_t file_size,
                                     const std::string& src) {
    check(file_size >= 8 && first8.size() >= 8, src, ": truncated: ", file_size,
          " bytes, expected at least 8 (the header length)");
    const std::uint64_t n = io::detail::load_le<std::uint64_t>(first8.data());
    check(n <= io::detail::max_header_bytes, src, ": header length ", n,
          " is larger than the limit of ", io::detail::max_header_bytes, " bytes");
    check(n <= file_size - 8, src, ": header length ", n, " runs past the end of the file (",
          file_size - 8, " bytes after the length)");
    check(n >= 2, src, ": header length is ", n, ", expected at least 2 (\"{}\")");
    return n;
  }

  /// Parses and validates the JSON header `text` of a file whose data area holds `data_size`
  /// bytes (the view addresses no data yet).
  static safetensors_view parse_header(std::span<const std::byte> text, std::uint64_t data_size,
                                       std::string source) {
    using nlohmann::json;
    safetensors_view v;
    v.source_ = std::move(source);
    const std::string& src = v.source_;
    const auto* first = reinterpret_cast<const char*>(text.data());
    const std::size_t n = text.size();

    // Duplicate keys (nlohmann keeps the last one silently) and nesting are checked while
    // parsing: a header never needs more than {name: {key: [int, ...]}}.
    std::vector<std::set<std::string>> keys;
    std::string current;  // the tensor whose entry is being parsed
    auto callback = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
      switch (event) {
        case json::parse_event_t::object_start:
          check(depth <= 1, src, ": tensor '", current,
                "': header nests objects too deeply (a safetensors entry holds no objects)");
          keys.emplace_back();
          break;
        case json::parse_event_t::array_start:
          check(depth <= 2, src, ": tensor '", current,
                "': header nests arrays too deeply (shape and data_offsets are flat)");
          break;
        case json::parse_event_t::object_end:
          keys.pop_back();
          break;
        case json::parse_event_t::key: {
          std::string key = parsed.get<std::string>();
          if (keys.size() == 1) {
            check(!keys.back().contains(key), src, ": duplicate tensor name '", key,
                  "' in the header");
            current = key;
          } else {
            check(!keys.back().contains(key), src, ": tensor '", current, "': duplicate key '", key,
                  "'");
          }
          keys.back().insert(std::move(key));
          break;
        }
        default:
          break;
      }
      return true;
    };
    json header;
    try {
      header = json::parse(first, first + n, callback);
    } catch (const json::exception& e) {
      fail(src, ": header is not valid JSON: ", e.what());
    }
    check(header.is_object(), src, ": header is a JSON ", header.type_name(),
          ", expected an object");

    for (auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        check(entry.is_object(), src, ": __metadata__ is a JSON ", entry.type_name(),
              ", expected an object of strings");
        for (auto& [key, value] : entry.items()) {
          check(value.is_string(), src, ": __metadata__ entry '", key, "' is ", value.dump(),
                ", expected a string");
          v.metadata_.emplace(key, value.get<std::string>());
        }
        continue;
      }
      v.tensors_.push_back(parse_entry(src, name, entry, data_size));
    }

    // File order: by offset; then no two non-empty byte ranges may overlap.
    std::sort(v.tensors_.begin(), v.tensors_.end(), [](const tensor_info& a, const tensor_info& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
    });
    const tensor_info* previous = nullptr;
    for (const tensor_info& t : v.tensors_) {
      if (t.begin == t.end) continue;
      if (previous != nullptr)
        check(t.begin >= previous->end, src, ": tensor '", t.name, "': data_offsets [", t.begin,
              ", ", t.end, "] overlap those of tensor '", previous->name, "' [", previous->begin,
              ", ", previous->end, "]");
      previous = &t;
    }
    for (std::size_t i = 0; i < v.tensors_.size(); ++i) v.index_.emplace(v.tensors_[i].name, i);
    return v;
  }

 public:
  /// The file name used in messages.
  const std::string& source() const { return source_; }
  /// Number of tensors.
  std::size_t size() const { return tensors_.size(); }
  /// Tensor names in file order (by data offset).
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(tensors_.size());
    for (const auto& t : tensors_) out.push_back(t.name);
    return out;
  }
  /// Every tensor, in file order.
  std::span<const tensor_info> tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return index_.contains(name); }
  /// dtype, shape and offsets of `name`; throws tightfit::error naming it when absent.
  const tensor_info& info(const std::string& name) const {
    auto it = index_.find(name);
    check(it != index_.end(), source_, ": no tensor named '", name, "'");
    return tensors_[it->second];
  }
  /// The "__metadata__" string map (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The raw little-endian bytes of `name` (a view of memory; a safetensors_file reads them with
  /// read_raw).
  std::span<const std::byte> bytes(const std::string& name) const {
    const tensor_info& t = info(name);
    check(file_ == nullptr, source_, ": tensor '", name,
          "': bytes() views memory, and this file is read by position (use read_raw)");
    return data_.subspan(static_cast<std::size_t>(t.begin),
                         static_cast<std::size_t>(t.end - t.begin));
  }
  /// The raw little-endian bytes of `name`, copied.
  std::vector<std::byte> read_raw(const std::string& name) const {
    const tensor_info& t = info(name);
    std::vector<std::byte> out(static_cast<std::size_t>(t.end - t.begin));
    if (file_ != nullptr)
      file_->read(data_offset_ + t.begin, out);
    else if (!out.empty())
      std::memcpy(out.data(), data_.data() + t.begin, out.size());
    return out;
  }

  /// Converts the F64 / F32 / BF16 / F16 tensor `name` into `out` (exact when widening,
  /// round to nearest when F64 -> float). out.size() must equal the element count.
  template <class T>
  requires std::is_same_v<T, float> || std::is_same_v<T, double>
  void read(const std::string& name, std::span<T> out) const {
    const tensor_info& t = info(name);
    const auto n = static_cast<std::size_t>(t.numel());
    check(out.size() == n, source_, ": tensor '", name, "' has ", n, " elements (shape ",
          io::detail::shape_string(t.shape), "), the destination holds ", out.size());
    check(is_floating(t.type), source_, ": tensor '", name, "' has dtype ", dtype_name(t.type),
          ", which cannot be read as floating point (expected F64, F32, BF16 or F16)");
    constexpr bool little = std::endian::native == std::endian::little;
    auto blocks = [&](std::size_t size, auto convert) {  // out[first + i] = convert(p + size i)
      for_blocks(t, size, [&](const std::byte* p, std::size_t first, std::size_t count) {
        for (std::size_t i = 0; i < count; ++i) out[first + i] = convert(p + size * i);
      });
    };
    switch (t.type) {
      case dtype::f64:
        if constexpr (little && std::is_same_v<T, double>) {
          copy_raw(t, std::as_writable_bytes(out));
        } else {
          blocks(8, [](const std::byte* q) {
            return static_cast<T>(std::bit_cast<double>(io::detail::load_le<std::uint64_t>(q)));
          });
        }
        break;
      case dtype::f32:
        if constexpr (little && std::is_same_v<T, float>) {
          copy_raw(t, std::as_writable_bytes(out));
        } else {
          blocks(4, [](const std::byte* q) {
            return static_cast<T>(std::bit_cast<float>(io::detail::load_le<std::uint32_t>(q)));
          });
        }
        break;
      case dtype::bf16:
        blocks(2, [](const std::byte* q) {
          return static_cast<T>(io::detail::bf16_to_float(io::detail::load_le<std::uint16_t>(q)));
        });
        break;
      case dtype::f16:
        blocks(2, [](const std::byte* q) {
          return static_cast<T>(io::detail::f16_to_float(io::detail::load_le<std::uint16_t>(q)));
        });
        break;
      default:
        break;
    }
  }

  /// The floating tensor `name` as a vector of T.
  template <class T>
  requires std::is_same_v<T, float> || std::is_same_v<T, double> std::vector<T> read(
      const std::string& name)
  const {
    std::vector<T> out(static_cast<std::size_t>(info(name).numel()));
    read<T>(name, std::span<T>(out));
    return out;
  }

  /// The integer tensor `name` (I64, I32, I16, I8, U64, U32, U16, U8, BOOL) as int64 values.
  std::vector<std::int64_t> read_ints(const std::string& name) const {
    using io::detail::load_le;
    const tensor_info& t = info(name);
    const auto n = static_cast<std::size_t>(t.numel());
    std::vector<std::int64_t> out(n);
    auto each = [&](std::size_t size, auto load) {  // out[first + i] = load(p + size i)
      for_blocks(t, size, [&](const std::byte* p, std::size_t first, std::size_t count) {
        for (std::size_t i = 0; i < count; ++i)
          out[first + i] = static_cast<std::int64_t>(load(p + size * i));
      });
    };
    switch (t.type) {
      case dtype::i64:
        each(8, [](const std::byte* q) { return load_le<std::int64_t>(q); });
        break;
      case dtype::i32:
        each(4, [](const std::byte* q) { return load_le<std::int32_t>(q); });
        break;
      case dtype::i16:
        each(2, [](const std::byte* q) { return load_le<std::int16_t>(q); });
        break;
      case dtype::i8:
        each(1, [](const std::byte* q) { return load_le<std::int8_t>(q); });
        break;
      case dtype::u32:
        each(4, [](const std::byte* q) { return load_le<std::uint32_t>(q); });
        break;
      case dtype::u16:
        each(2, [](const std::byte* q) { return load_le<std::uint16_t>(q); });
        break;
      case dtype::u8:
        each(1, [](const std::byte* q) { return load_le<std::uint8_t>(q); });
        break;
      case dtype::boolean:
        each(1, [](const std::byte* q) { return load_le<std::uint8_t>(q) != 0 ? 1 : 0; });
        break;
      case dtype::u64:
        for_blocks(t, 8, [&](const std::byte* p, std::size_t first, std::size_t count) {
          for (std::size_t i = 0; i < count; ++i) {
            const auto x = load_le<std::uint64_t>(p + 8 * i);
            check(x <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                  source_, ": tensor '", name, "' element ", first + i, " is ", x,
                  ", which does not fit int64");
            out[first + i] = static_cast<std::int64_t>(x);
          }
        });
        break;
      default:
        fail(source_, ": tensor '", name, "' has dtype ", dtype_name(t.type),
             ", which cannot be read as integers (expected I64, I32, I16, I8, U64, U32, U16, U8 or "
             "BOOL)");
    }
    return out;
  }

 protected:
  /// The file this view reads by position (safetensors_file), and where its data area begins.
  std::shared_ptr<const io::detail::file_reader> file_;
  std::uint64_t data_offset_ = 0;

 private:
  /// Calls f(p, first, count) over the elements of `t` (`size` bytes each) in blocks: p points
  /// at `count` elements starting with element `first`. One block for a view of memory; blocks of
  /// at most 1 MiB read by position from a file.
  template <class F>
  void for_blocks(const tensor_info& t, std::size_t size, F&& f) const {
    const std::size_t n = static_cast<std::size_t>(t.end - t.begin) / size;
    if (n == 0) return;
    if (file_ == nullptr) {
      f(data_.data() + t.begin, std::size_t{0}, n);
      return;
    }
    const std::size_t per = std::max<std::size_t>(1, (std::size_t{1} << 20) / size);
    std::vector<std::byte> buf(std::min(n, per) * size);
    for (std::size_t first = 0; first < n; first += per) {
      const std::size_t count = std::min(per, n - first);
      file_->read(data_offset_ + t.begin + first * size, std::span(buf.data(), count * size));
      f(static_cast<const std::byte*>(buf.data()), first, count);
    }
  }
  /// The bytes of `t` into `out` (as many as it holds).
  void copy_raw(const tensor_info& t, std::span<std::byte> out) const {
    if (out.empty()) return;
    if (file_ != nullptr)
      file_->read(data_offset_ + t.begin, out);
    else
      std::memcpy(out.data(), data_.data() + t.begin, out.size());
  }

  static tensor_info parse_entry(const std::string& src, const std::string& name,
                                 const nlohmann::json& entry, std::uint64_t data_size) {
    using io::detail::json_uint;
    const std::string where = src + ": tensor '" + name + "'";
    check(!name.empty(), src, ": a tensor has an empty name");
    check(entry.is_object(), where, ": entry is a JSON ", entry.type_name(),
          ", expected an object");
    tensor_info t;
    t.name = name;

    auto dt = entry.find("dtype");
    check(dt != entry.end(), where, ": missing dtype");
    check(dt->is_string(), where, ": dtype is ", dt->dump(), ", expected a string such as \"F32\"");
    const auto known = parse_dtype(dt->get<std::string>());
    check(known.has_value(), where, ": unknown dtype ", dt->dump());
    t.type = *known;

    auto sh = entry.find("shape");
    check(sh != entry.end(), where, ": missing shape");
    check(sh->is_array(), where, ": shape is ", sh->dump(), ", expected an array of integers");
    std::uint64_t count = 1;
    for (std::size_t i = 0; i < sh->size(); ++i) {
      const std::string what = where + ": shape[" + std::to_string(i) + "]";
      const std::uint64_t e = json_uint((*sh)[i], what, "a non-negative integer");
      check(e <= static_cast<std::uint64_t>(std::numeric_limits<index_t>::max()), what, " is ", e,
            ", which overflows the index type");
      const auto next = io::detail::checked_mul(count, e);
      check(next.has_value(), where, ": shape ", sh->dump(), " overflows the element count");
      count = *next;
      t.shape.push_back(static_cast<index_t>(e));
    }
    const auto bytes = io::detail::checked_mul(count, dtype_size(t.type));
    check(bytes.has_value(), where, ": shape ", sh->dump(), " x ", dtype_name(t.type),
          " overflows the byte count");

    auto off = entry.find("data_offsets");
    check(off != entry.end(), where, ": missing data_offsets");
    check(off->is_array() && off->size() == 2, where, ": data_offsets is ", off->dump(),
          ", expected [begin, end]");
    t.begin = json_uint((*off)[0], where + ": data_offsets[0]", "a non-negative integer");
    t.end = json_uint((*off)[1], where + ": data_offsets[1]", "a non-negative integer");
    check(t.begin <= t.end, where, ": data_offsets [", t.begin, ", ", t.end, "] have begin > end");
    check(t.end <= data_size, where, ": data_offsets [", t.begin, ", ", t.end,
          "] run past the end of the data area (", data_size, " bytes)");
    check(t.end - t.begin == *bytes, where, ": data_offsets [", t.begin, ", ", t.end, "] hold ",
          t.end - t.begin, " bytes, expected ", *bytes, " (shape ",
          io::detail::shape_string(t.shape), " x ", dtype_name(t.type), ")");
    return t;
  }

  std::span<const std::byte> data_;   // the data area (after the header)
  std::vector<tensor_info> tensors_;  // in file order
  std::unordered_map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::string source_;
};

/// A safetensors file, validated on open and read by position (pread) while it lives: a file
/// truncated under it gives a tightfit::error naming it, not SIGBUS (move-only).
class safetensors_file : public safetensors_view {
 public:
  safetensors_file() = default;
  /// Opens and validates `path`; throws tightfit::error naming the file and the problem.
  static safetensors_file open(const std::filesystem::path& path) {
    auto file = std::make_shared<const io::detail::file_reader>(path);
    const std::string src = path.string();
    std::array<std::byte, 8> first8{};
    const std::uint64_t size = file->size();
    if (size >= 8) file->read(0, first8);
    const std::uint64_t n =
        header_length(std::span<const std::byte>(first8.data(), size >= 8 ? 8 : 0), size, src);
    std::vector<std::byte> header(static_cast<std::size_t>(n));
    file->read(8, header);
    safetensors_file f;
    static_cast<safetensors_view&>(f) = parse_header(header, size - 8 - n, src);
    f.file_ = std::move(file);
    f.data_offset_ = 8 + n;
    return f;
  }
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;
  safetensors_file(safetensors_file&&) noexcept = default;
  safetensors_file& operator=(safetensors_file&&) noexcept = default;
  ~safetensors_file() = default;
};

/// Collects tensors and writes a safetensors file that the reference (Python/Rust) reader
/// accepts: header padded with spaces to a multiple of 8 bytes, tensors stored in the
/// reference order (larger element size first, then by name) so each is aligned, contiguous.
class safetensors_writer {
 public:
  /// Adds a tensor, converted now to `as` (default: F32 for float, F64 for double, I64 / I32
  /// for int64 / int32). Floating data converts to F64, F32, BF16 or F16 (round to nearest
  /// even); integer data to I64 or I32 (range-checked).
  void add(std::string name, std::vector<index_t> shape, std::span<const float> data,
           std::optional<dtype> as = std::nullopt) {
    add_impl(std::move(name), std::move(shape), data, as.value_or(dtype::f32));
  }
  void add(std::string name, std::vector<index_t> shape, std::span<const double> data,
           std::optional<dtype> as = std::nullopt) {
    add_impl(std::move(name), std::move(shape), data, as.value_or(dtype::f64));
  }
  void add(std::string name, std::vector<index_t> shape, std::span<const std::int64_t> data,
           std::optional<dtype> as = std::nullopt) {
    add_impl(std::move(name), std::move(shape), data, as.value_or(dtype::i64));
  }
  void add(std::string name, std::vector<index_t> shape, std::span<const std::int32_t> data,
           std::optional<dtype> as = std::nullopt) {
    add_impl(std::move(name), std::move(shape), data, as.value_or(dtype::i32));
  }

  /// Sets a "__metadata__" entry (e.g. {"format", "pt"}, which transformers expects).
  void set_metadata(std::string key, std::string value) {
    check_utf8(key, "metadata key");
    check_utf8(value, "metadata value");
    metadata_[std::move(key)] = std::move(value);
  }

  /// Number of tensors added.
  std::size_t size() const { return tensors_.size(); }

  /// The complete file image.
  std::vector<std::byte> serialize() const {
    const std::string header = header_json();
    std::vector<std::byte> out(8 + header.size());
    io::detail::store_le<std::uint64_t>(header.size(), out.data());
    std::memcpy(out.data() + 8, header.data(), header.size());
    for (const pending* t : ordered()) out.insert(out.end(), t->bytes.begin(), t->bytes.end());
    return out;
  }

  /// Writes the file to `path` (replaced if it exists); throws tightfit::error on I/O failure.
  void write(const std::filesystem::path& path) const {
    const std::string header = header_json();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    check(static_cast<bool>(out), path.string(), ": cannot open for writing");
    std::byte length[8];
    io::detail::store_le<std::uint64_t>(header.size(), length);
    out.write(reinterpret_cast<const char*>(length), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const pending* t : ordered())
      out.write(reinterpret_cast<const char*>(t->bytes.data()),
                static_cast<std::streamsize>(t->bytes.size()));
    out.close();
    check(static_cast<bool>(out), path.string(), ": write failed");
  }

 private:
  struct pending {
    std::string name;
    dtype type;
    std::vector<index_t> shape;
    std::vector<std::byte> bytes;  // little-endian, converted
  };

  static void check_utf8(const std::string& s, const char* what) {
    try {
      (void)nlohmann::json(s).dump();
    } catch (const nlohmann::json::exception&) {
      fail("safetensors_writer: ", what, " is not valid UTF-8");
    }
  }

  template <class T>
  void add_impl(std::string name, std::vector<index_t> shape, std::span<const T> data, dtype as) {
    const char* where = "safetensors_writer::add";
    check(!name.empty(), where, ": empty tensor name");
    check(name != "__metadata__", where, ": '__metadata__' is reserved");
    check_utf8(name, "tensor name");
    check(!names_.contains(name), where, ": duplicate tensor name '", name, "'");
    index_t count = 1;
    for (index_t e : shape) {
      check(e >= 0, where, ": tensor '", name, "' has extent ", e, ", expected >= 0");
      count *= e;
    }
    check(static_cast<std::size_t>(count) == data.size(), where, ": tensor '", name, "' shape ",
          io::detail::shape_string(shape), " holds ", count, " elements, the data has ",
          data.size());
    pending p{std::move(name), as, std::move(shape), {}};
    p.bytes.resize(data.size() * dtype_size(as));
    std::byte* out = p.bytes.data();
    using io::detail::store_le;
    if constexpr (std::is_floating_point_v<T>) {
      check(is_floating(as), where, ": tensor '", p.name, "': floating data cannot be stored as ",
            dtype_name(as), " (expected F64, F32, BF16 or F16)");
      auto each = [&](auto convert) {
        for (std::size_t i = 0; i < data.size(); ++i) {
          const auto bits = convert(static_cast<double>(data[i]));
          store_le(bits, out + sizeof(bits) * i);
        }
      };
      switch (as) {
        case dtype::f64:
          each([](double x) { return std::bit_cast<std::uint64_t>(x); });
          break;
        case dtype::f32:
          each([](double x) { return std::bit_cast<std::uint32_t>(static_cast<float>(x)); });
          break;
        case dtype::bf16:
          each(io::detail::double_to_bf16);
          break;
        default:
          each(io::detail::double_to_f16);
          break;
      }
    } else {
      check(as == dtype::i64 || as == dtype::i32, where, ": tensor '", p.name,
            "': integer data cannot be stored as ", dtype_name(as), " (expected I64 or I32)");
      for (std::size_t i = 0; i < data.size(); ++i) {
        const auto x = static_cast<std::int64_t>(data[i]);
        if (as == dtype::i64) {
          store_le(static_cast<std::uint64_t>(x), out + 8 * i);
        } else {
          check(x >= std::numeric_limits<std::int32_t>::min() &&
                    x <= std::numeric_limits<std::int32_t>::max(),
                where, ": tensor '", p.name, "' element ", i, " is ", x,
                ", which does not fit I32");
          store_le(static_cast<std::uint32_t>(static_cast<std::int32_t>(x)), out + 4 * i);
        }
      }
    }
    names_.insert(p.name);
    tensors_.push_back(std::move(p));
  }

  std::vector<const pending*> ordered() const {
    std::vector<const pending*> order;
    for (const auto& t : tensors_) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const pending* a, const pending* b) {
      const std::size_t sa = dtype_size(a->type), sb = dtype_size(b->type);
      return sa != sb ? sa > sb : a->name < b->name;
    });
    return order;
  }

  std::string header_json() const {
    nlohmann::json header = nlohmann::json::object();
    std::uint64_t offset = 0;
    for (const pending* t : ordered()) {
      const std::uint64_t end = offset + t->bytes.size();
      header[t->name] = {
          {"dtype", dtype_name(t->type)}, {"shape", t->shape}, {"data_offsets", {offset, end}}};
      offset = end;
    }
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
  }

  std::vector<pending> tensors_;
  std::set<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tightfit
