// Arrays from Python, read in place: any object with the buffer protocol (numpy arrays,
// memoryviews) or __dlpack__ (torch CPU tensors) becomes an array_view, a pointer, an element
// type, a shape and byte strides. Anything else (a list) goes through numpy.asarray first.
// Invariants: nothing is copied; the view keeps its exporter alive (the Py_buffer or the DLPack
// tensor) while it lives; it is created and destroyed with the GIL held and may be read without
// it. Conversions (to_int64, to_double) check the element type and name the argument.
#pragma once

#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dlpack.hpp"
#include "tightfit/core/error.hpp"

namespace tightfit::python {

namespace py = pybind11;

/// Element types the module reads.
enum class element { f32, f64, i8, i16, i32, i64, u8, u16, u32, u64, boolean, other };

struct array_view {
  const unsigned char* data = nullptr;
  element type = element::other;
  std::string type_name;                     ///< for messages: float32, int64, float16, ...
  std::vector<std::int64_t> shape, strides;  ///< strides in bytes
  std::shared_ptr<void> owner;               ///< the buffer or DLPack tensor, released last

  std::int64_t size() const {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    return n;
  }
  /// The element at byte offset `at`, converted to V.
  template <class V>
  V get(std::int64_t at) const {
    auto read = [&](auto zero) {
      decltype(zero) x;
      std::memcpy(&x, data + at, sizeof x);
      return static_cast<V>(x);
    };
    switch (type) {
      case element::f32:
        return read(float{});
      case element::f64:
        return read(double{});
      case element::i8:
        return read(std::int8_t{});
      case element::i16:
        return read(std::int16_t{});
      case element::i32:
        return read(std::int32_t{});
      case element::i64:
        return read(std::int64_t{});
      case element::u8:
        return read(std::uint8_t{});
      case element::u16:
        return read(std::uint16_t{});
      case element::u32:
        return read(std::uint32_t{});
      case element::u64:
        return read(std::uint64_t{});
      case element::boolean:
        return static_cast<V>(read(std::uint8_t{}) != 0);
      case element::other:
        break;
    }
    return V{};
  }
  /// Byte offset of element `i` in row-major order (any dimension count).
  std::int64_t offset(std::int64_t i) const {
    std::int64_t at = 0;
    for (std::size_t d = shape.size(); d-- > 0;) {
      at += (i % shape[d]) * strides[d];
      i /= shape[d];
    }
    return at;
  }
  bool is_integer() const {
    return type != element::f32 && type != element::f64 && type != element::other;
  }
  bool is_float() const { return type == element::f32 || type == element::f64; }
};

namespace detail {

inline element integer_element(bool is_signed, std::int64_t bytes) {
  switch (bytes) {
    case 1:
      return is_signed ? element::i8 : element::u8;
    case 2:
      return is_signed ? element::i16 : element::u16;
    case 4:
      return is_signed ? element::i32 : element::u32;
    case 8:
      return is_signed ? element::i64 : element::u64;
    default:
      return element::other;
  }
}

inline std::string element_name(element e, const std::string& other) {
  static const char* names[] = {"float32", "float64", "int8",   "int16",  "int32", "int64",
                                "uint8",   "uint16",  "uint32", "uint64", "bool"};
  return e == element::other ? other : names[static_cast<int>(e)];
}

/// The element type of a struct-module format ("<f", "d", "l", "?", ...) of `itemsize` bytes.
inline element format_element(std::string f, std::int64_t itemsize) {
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.erase(0, 1);
  if (f.size() != 1) return element::other;  // big-endian ('>', '!'), records, ...
  const char c = f[0];
  if (c == 'f' && itemsize == 4) return element::f32;
  if (c == 'd' && itemsize == 8) return element::f64;
  if (c == '?' && itemsize == 1) return element::boolean;
  if (std::strchr("bhilq", c)) return integer_element(true, itemsize);
  if (std::strchr("BHILQ", c)) return integer_element(false, itemsize);
  return element::other;
}

inline array_view from_buffer(py::handle obj, const std::string& name) {
  auto buffer = std::make_unique<Py_buffer>();
  if (PyObject_GetBuffer(obj.ptr(), buffer.get(), PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    fail(name, ": cannot read the array's buffer (a strided, typed buffer is expected)");
  }
  array_view v;
  v.owner = std::shared_ptr<Py_buffer>(buffer.release(), [](Py_buffer* b) {
    PyBuffer_Release(b);
    delete b;
  });
  const Py_buffer& b = *static_cast<Py_buffer*>(v.owner.get());
  v.data = static_cast<const unsigned char*>(b.buf);
  const std::string format = b.format ? b.format : "B";
  v.type = format_element(format, b.itemsize);
  v.type_name = element_name(v.type, "'" + format + "' (" + std::to_string(b.itemsize) + " bytes)");
  for (int d = 0; d < b.ndim; ++d) {
    v.shape.push_back(b.shape[d]);
    v.strides.push_back(b.strides[d]);
  }
  return v;
}

inline array_view from_dlpack(py::handle obj, const std::string& name) {
  py::object capsule = obj.attr("__dlpack__")();
  auto* t = static_cast<dlpack::managed_tensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (t == nullptr) {
    PyErr_Clear();
    fail(name, ": __dlpack__ did not return a DLPack capsule");
  }
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");  // this view owns the tensor now
  array_view v;
  v.owner = std::shared_ptr<dlpack::managed_tensor>(t, [](dlpack::managed_tensor* m) {
    if (m->deleter) m->deleter(m);
  });
  const dlpack::tensor& d = t->dl_tensor;
  check(d.dev.type == dlpack::cpu || d.dev.type == dlpack::cuda_host, name,
        ": the tensor is on DLPack device type ", d.dev.type,
        ", expected CPU memory (move it with .cpu())");
  const std::int64_t bytes = d.dtype.bits / 8;
  if (d.dtype.lanes == 1) {
    if (d.dtype.code == dlpack::float_ && d.dtype.bits == 32) v.type = element::f32;
    if (d.dtype.code == dlpack::float_ && d.dtype.bits == 64) v.type = element::f64;
    if (d.dtype.code == dlpack::int_) v.type = integer_element(true, bytes);
    if (d.dtype.code == dlpack::uint_) v.type = integer_element(false, bytes);
    if (d.dtype.code == dlpack::bool_ && bytes == 1) v.type = element::boolean;
  }
  v.type_name = element_name(v.type, "DLPack type code " + std::to_string(d.dtype.code) + " of " +
                                         std::to_string(d.dtype.bits) + " bits");
  v.data = static_cast<const unsigned char*>(d.data) + d.byte_offset;
  std::int64_t step = bytes;  // row-major strides when the tensor gives none
  v.shape.assign(d.shape, d.shape + d.ndim);
  v.strides.assign(static_cast<std::size_t>(d.ndim), 0);
  for (int k = d.ndim; k-- > 0;) {
    v.strides[static_cast<std::size_t>(k)] = d.strides ? d.strides[k] * bytes : step;
    step *= d.shape[k];
  }
  return v;
}

}  // namespace detail

/// A view of `obj` (buffer protocol first, then __dlpack__, else numpy.asarray(obj)); `name`
/// (the argument) begins every message.
inline array_view view_array(py::handle obj, const std::string& name) {
  if (PyObject_CheckBuffer(obj.ptr())) return detail::from_buffer(obj, name);
  if (py::hasattr(obj, "__dlpack__")) return detail::from_dlpack(obj, name);
  py::object converted;
  try {
    converted = py::module_::import("numpy").attr("asarray")(obj);
  } catch (py::error_already_set&) {
    fail(name, ": expected an array (buffer protocol or __dlpack__), got ",
         std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  return detail::from_buffer(converted, name);
}

/// The shape as "(2, 3)".
inline std::string shape_string(const array_view& v) {
  std::string s = "(";
  for (std::size_t d = 0; d < v.shape.size(); ++d)
    s += (d ? ", " : "") + std::to_string(v.shape[d]);
  return s + (v.shape.size() == 1 ? ",)" : ")");
}

/// Every element as int64 (row-major); an integer or bool array only.
inline std::vector<std::int64_t> to_int64(const array_view& v, const std::string& name) {
  check(v.is_integer(), name, " has dtype ", v.type_name, ", expected integers");
  std::vector<std::int64_t> out(static_cast<std::size_t>(v.size()));
  for (std::int64_t i = 0; i < v.size(); ++i) {
    out[static_cast<std::size_t>(i)] = v.get<std::int64_t>(v.offset(i));
    if (v.type == element::u64)
      check(v.get<std::uint64_t>(v.offset(i)) <= std::uint64_t{INT64_MAX}, name, "[", i,
            "] does not fit int64");
  }
  return out;
}

/// Every element as double (row-major), each finite; a float or integer array.
inline std::vector<double> to_double(const array_view& v, const std::string& name) {
  check(v.is_float() || v.is_integer(), name, " has dtype ", v.type_name, ", expected numbers");
  std::vector<double> out(static_cast<std::size_t>(v.size()));
  for (std::int64_t i = 0; i < v.size(); ++i) {
    const double x = v.get<double>(v.offset(i));
    check(std::isfinite(x), name, " holds ", x, " at flat index ", i, ", expected finite values");
    out[static_cast<std::size_t>(i)] = x;
  }
  return out;
}

}  // namespace tightfit::python
