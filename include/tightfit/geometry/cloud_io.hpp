// tightfit/geometry/cloud_io.hpp: reading and writing point clouds: PLY (ASCII and binary
// little-endian; x, y, z as float or double; other properties and elements ignored) and XYZ/CSV
// text (three numbers per line, separated by spaces, tabs or commas; '#' comments; one header
// line allowed). read_cloud / read_ply widen to `points` (double); read_cloud_stored keeps a
// binary PLY's float x, y, z as a float_cloud (12 bytes per point, read with one positional read
// when the vertices are exactly x, y, z).
//
// Files are read by position (pread on POSIX systems, never mmap): a file truncated by another
// process while it is read ends in a tightfit::error naming the file ("the file ends at byte
// ..."), never in SIGBUS. A path that is a directory is refused by name; a FIFO or a device is read
// as a stream of unknown length, and opening a FIFO that has no writer does not block (it reads as
// empty).
//
// Every malformed input (a header line with a missing, extra or malformed token, an unknown
// keyword, big-endian or list vertex properties, truncated data, a bad number, NaN or infinite
// coordinates) raises tightfit::error naming the file and the offending line, vertex or
// property; nothing is silently skipped. Untrusted sizes: every count read from a file is checked
// against the file's length before anything is allocated (a 243-byte PLY cannot claim 10^8
// vertices; element sizes cannot overflow) and against the caller's max_points, lines are read
// with a bounded length (a header line, or an XYZ line, longer than max_line_bytes is an error,
// so /dev/zero or a file without newlines cannot grow memory), and data of unknown length (a
// pipe) is read in bounded chunks.
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <span>
#include <sstream>
#include <streambuf>
#include <string>
#include <variant>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#define TIGHTFIT_CLOUD_IO_POSIX 1
#endif

#include "tightfit/core/error.hpp"
#include "tightfit/geometry/point_cloud.hpp"

namespace tightfit::geometry {

/// The longest line read_ply (header) and read_xyz accept.
inline constexpr std::size_t max_line_bytes = 1u << 16;
/// No limit on the points of a cloud (beyond what its file can hold).
inline constexpr std::size_t unlimited_points = static_cast<std::size_t>(-1);

namespace detail {
// getline with a bound: false at the end of the input; throws when a line exceeds `limit`.
inline bool bounded_getline(std::istream& in, std::string& line, const std::string& path,
                            const char* where, long long lineno,
                            std::size_t limit = max_line_bytes) {
  line.clear();
  std::streambuf* sb = in.rdbuf();
  for (;;) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(std::ios::eofbit);
      return !line.empty();
    }
    if (c == '\n') return true;
    line.push_back(static_cast<char>(c));
    check(line.size() <= limit, where, ": '", path, "' line ", lineno, " is longer than ", limit,
          " bytes, expected a line of text");
  }
}

// The length of the file at `path` (-1 when unknown: not a regular file, e.g. a pipe or
// /dev/zero).
inline long long file_length(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return -1;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? -1 : static_cast<long long>(size);
}
// The number of bytes left in `in` (of total `length`, -1: unknown) from its current position.
inline long long bytes_left(std::istream& in, long long length) {
  const auto pos = in.tellg();
  if (length < 0 || pos < 0) return -1;
  return length - static_cast<long long>(pos);
}

inline int ply_type_size(const std::string& t) {
  if (t == "char" || t == "uchar" || t == "int8" || t == "uint8") return 1;
  if (t == "short" || t == "ushort" || t == "int16" || t == "uint16") return 2;
  if (t == "int" || t == "uint" || t == "int32" || t == "uint32" || t == "float" || t == "float32")
    return 4;
  if (t == "double" || t == "float64") return 8;
  return 0;
}
inline bool ply_is_float(const std::string& t) {
  return t == "float" || t == "float32";
}
inline bool ply_is_double(const std::string& t) {
  return t == "double" || t == "float64";
}

struct ply_property {
  std::string name, type;
  bool list = false;
};
struct ply_element {
  std::string name;
  std::size_t count = 0;
  std::vector<ply_property> props;
};

// Where a PLY's vertices are: the header parsed, every count checked against the length and the
// elements before the vertices skipped (`in` is left at the first vertex).
struct ply_vertices {
  bool ascii = false;
  std::size_t count = 0;
  std::vector<ply_property> props;
  int ix = -1, iy = -1, iz = -1;  // the x, y, z properties
  int lineno = 0;                 // the last header line (ascii messages)
};
// The whitespace-separated tokens of a header line.
inline std::vector<std::string> ply_tokens(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream ls(line);
  for (std::string t; ls >> t;) out.push_back(t);
  return out;
}
inline ply_vertices read_ply_header(std::istream& in, const std::string& path, long long length,
                                    std::size_t max_points = unlimited_points) {
  std::string line;
  detail::bounded_getline(in, line, path, "read_ply", 1, 64);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  check(line == "ply", "read_ply: '", path, "' starts with '", line.substr(0, 40),
        "', expected 'ply'");
  std::string format;
  std::vector<detail::ply_element> elements;
  bool ended = false;
  int lineno = 1;
  while (detail::bounded_getline(in, line, path, "read_ply", lineno + 1)) {
    ++lineno;
    check(lineno <= 100000, "read_ply: '", path, "' has a header of more than 100000 lines");
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::vector<std::string> tok = ply_tokens(line);
    auto bad = [&](const char* expected) {
      fail("read_ply: '", path, "' line ", lineno, ": bad ", tok.empty() ? "" : tok[0].c_str(),
           " line '", line.substr(0, 80), "' (expected ", expected, ")");
    };
    if (tok.empty()) continue;
    const std::string& kw = tok[0];
    if (kw == "comment" || kw == "obj_info") continue;
    if (kw == "format") {
      if (tok.size() != 3 || tok[2] != "1.0" || !format.empty())
        bad("one line 'format ascii|binary_little_endian|binary_big_endian 1.0'");
      format = tok[1];
    } else if (kw == "element") {
      // the count: decimal digits only, below 2^40 (no sign, no hex, nothing after it)
      if (tok.size() != 3 || tok[2].empty() || tok[2].size() > 13 ||
          tok[2].find_first_not_of("0123456789") != std::string::npos ||
          std::stoull(tok[2]) >= (1ull << 40))
        bad("'element NAME COUNT' with a count in [0, 2^40)");
      detail::ply_element e;
      e.name = tok[1];
      e.count = static_cast<std::size_t>(std::stoull(tok[2]));
      elements.push_back(e);
    } else if (kw == "property") {
      check(!elements.empty(), "read_ply: '", path, "' line ", lineno,
            ": property before any element");
      detail::ply_property p;
      if (tok.size() >= 2 && tok[1] == "list") {
        if (tok.size() != 5) bad("'property list COUNT_TYPE ITEM_TYPE NAME'");
        p.list = true, p.type = tok[2] + " " + tok[3], p.name = tok[4];
        check(detail::ply_type_size(tok[2]) > 0 && detail::ply_type_size(tok[3]) > 0, "read_ply: '",
              path, "' line ", lineno, ": unknown type in '", line.substr(0, 80), "'");
      } else {
        if (tok.size() != 3) bad("'property TYPE NAME'");
        p.type = tok[1], p.name = tok[2];
        check(detail::ply_type_size(p.type) > 0, "read_ply: '", path, "' line ", lineno,
              ": unknown type '", p.type, "'");
      }
      elements.back().props.push_back(p);
    } else if (kw == "end_header") {
      if (tok.size() != 1) bad("'end_header' alone");
      ended = true;
      break;
    } else {
      fail("read_ply: '", path, "' line ", lineno, ": unknown keyword '", kw.substr(0, 40),
           "' (expected format, element, property, comment, obj_info or end_header)");
    }
  }
  check(ended, "read_ply: '", path, "' has no end_header line");
  const bool ascii = format == "ascii";
  check(ascii || format == "binary_little_endian", "read_ply: '", path, "' has format '", format,
        "', expected ascii or binary_little_endian");
  std::size_t vi = elements.size();
  for (std::size_t e = 0; e < elements.size(); ++e)
    if (elements[e].name == "vertex") vi = e;
  check(vi < elements.size(), "read_ply: '", path, "' has no vertex element");
  const auto& ve = elements[vi];
  int ix = -1, iy = -1, iz = -1;
  for (std::size_t k = 0; k < ve.props.size(); ++k) {
    const auto& p = ve.props[k];
    if (p.name == "x" || p.name == "y" || p.name == "z") {
      check(!p.list && (detail::ply_is_float(p.type) || detail::ply_is_double(p.type)),
            "read_ply: '", path, "' vertex property ", p.name, " has type '", p.type,
            "', expected float or double");
      (p.name == "x" ? ix : p.name == "y" ? iy : iz) = static_cast<int>(k);
    }
    check(!p.list, "read_ply: '", path, "' vertex property '", p.name,
          "' is a list, expected scalars");
  }
  check(ix >= 0 && iy >= 0 && iz >= 0, "read_ply: '", path, "' vertex element lacks x, y or z");
  check(ve.count <= max_points, "read_ply: '", path, "' has ", ve.count,
        " vertices, more than the limit of ", max_points, " points");
  // every count against what the file can hold, before anything is allocated
  const long long left = detail::bytes_left(in, length);
  {
    long long need = 0;  // bytes the elements up to the vertices need at least
    for (std::size_t e = 0; e <= vi; ++e) {
      long long per = 0;  // bytes per entry at least (ascii: a digit and a separator each)
      for (const auto& p : elements[e].props)
        per += ascii ? 2 : (p.list ? 1 : detail::ply_type_size(p.type));
      per = std::max<long long>(per, 1);
      const auto count = static_cast<long long>(elements[e].count);
      if (left >= 0)
        check(count <= (left - need) / per, "read_ply: '", path, "' element '", elements[e].name,
              "' claims ", elements[e].count, " entries of at least ", per,
              " bytes, but the file has only ", left - need, " bytes left");
      need += count * per;
    }
  }
  // skip the elements before the vertices
  for (std::size_t e = 0; e < vi; ++e) {
    if (ascii) {
      for (std::size_t r = 0; r < elements[e].count; ++r)
        check(detail::bounded_getline(in, line, path, "read_ply", lineno), "read_ply: '", path,
              "' ends inside element '", elements[e].name, "'");
    } else {
      std::size_t sz = 0;
      for (const auto& p : elements[e].props) {
        check(!p.list, "read_ply: '", path, "' has list element '", elements[e].name,
              "' before the vertices, expected the vertex element first");
        sz += static_cast<std::size_t>(detail::ply_type_size(p.type));
      }
      // sz * count fits: the count was checked against the file length above
      in.seekg(static_cast<std::streamoff>(sz * elements[e].count), std::ios::cur);
      check(in.good(), "read_ply: '", path, "' ends inside element '", elements[e].name, "'");
    }
  }
  ply_vertices v;
  v.ascii = ascii;
  v.count = ve.count;
  v.props = ve.props;
  v.ix = ix, v.iy = iy, v.iz = iz;
  v.lineno = lineno;
  return v;
}
}  // namespace detail

namespace detail {
// The vertices described by `ve` from `in` (left at the first vertex by read_ply_header).
inline points read_ply_points(std::istream& in, const std::string& path, const ply_vertices& ve) {
  const bool ascii = ve.ascii;
  const int ix = ve.ix, iy = ve.iy, iz = ve.iz;
  const int lineno = ve.lineno;
  std::string line;
  points out;
  out.reserve(std::min<std::size_t>(ve.count, 1u << 20));  // grows with the data actually read
  if (ascii) {
    std::vector<double> vals(ve.props.size());
    for (std::size_t r = 0; r < ve.count; ++r) {
      check(detail::bounded_getline(in, line, path, "read_ply", lineno), "read_ply: '", path,
            "' ends after ", r, " of ", ve.count, " vertices");
      std::istringstream ls(line);
      for (std::size_t k = 0; k < vals.size(); ++k) {
        std::string tok;
        ls >> tok;
        char* end = nullptr;
        vals[k] = std::strtod(tok.c_str(), &end);
        check(!tok.empty() && end && *end == '\0', "read_ply: '", path, "' vertex ", r,
              ": property '", ve.props[k].name, "' is '", tok, "', expected a number");
      }
      out.emplace_back(vals[static_cast<std::size_t>(ix)], vals[static_cast<std::size_t>(iy)],
                       vals[static_cast<std::size_t>(iz)]);
    }
  } else {
    std::vector<std::size_t> offs(ve.props.size());
    std::size_t stride = 0;
    for (std::size_t k = 0; k < ve.props.size(); ++k)
      offs[k] = stride, stride += static_cast<std::size_t>(detail::ply_type_size(ve.props[k].type));
    // in chunks of at most 2^16 vertices: memory follows the data actually present
    const std::size_t chunk = 1u << 16;
    std::vector<char> buf(stride * std::min(ve.count, chunk));
    std::vector<char> is_float(ve.props.size());  // decided once, not per coordinate
    for (std::size_t k = 0; k < ve.props.size(); ++k)
      is_float[k] = detail::ply_is_float(ve.props[k].type);
    auto get = [&](std::size_t r, int k) {
      const char* p = buf.data() + r * stride + offs[static_cast<std::size_t>(k)];
      if (is_float[static_cast<std::size_t>(k)]) {
        float f;
        std::memcpy(&f, p, 4);
        return static_cast<double>(f);
      }
      double d;
      std::memcpy(&d, p, 8);
      return d;
    };
    for (std::size_t done = 0; done < ve.count;) {
      const std::size_t n = std::min(chunk, ve.count - done);
      in.read(buf.data(), static_cast<std::streamsize>(n * stride));
      const auto got = static_cast<std::size_t>(in.gcount());
      check(got == n * stride, "read_ply: '", path, "' ends after ", done + got / stride, " of ",
            ve.count, " vertices");
      for (std::size_t r = 0; r < n; ++r) out.emplace_back(get(r, ix), get(r, iy), get(r, iz));
      done += n;
    }
  }
  for (std::size_t r = 0; r < out.size(); ++r)
    check(out[r].allFinite(), "read_ply: '", path, "' vertex ", r, " is (", out[r].x(), ", ",
          out[r].y(), ", ", out[r].z(), "), expected finite coordinates");
  return out;
}
}  // namespace detail

/// Reads the vertices of a PLY from a binary stream `in` of `length` bytes (-1: unknown, then
/// the data is read in bounded chunks); `path` names it in messages. A file of more than
/// `max_points` vertices is refused before they are read.
inline points read_ply(std::istream& in, const std::string& path, long long length,
                       std::size_t max_points = unlimited_points) {
  const detail::ply_vertices ve = detail::read_ply_header(in, path, length, max_points);
  return detail::read_ply_points(in, path, ve);
}

/// A cloud as its file stores it: float_cloud for a binary PLY whose x, y, z are float (read
/// without widening to double: half the memory of `points`, no second copy), otherwise `points`.
using stored_cloud = std::variant<float_cloud, points>;

namespace detail {
// The byte layout of float x, y, z in a binary vertex record (usable: the format is binary and
// all three are float).
struct float_layout {
  bool usable = false;
  std::size_t stride = 0;
  std::array<std::size_t, 3> offset{};
};
inline float_layout float_layout_of(const ply_vertices& ve) {
  float_layout l;
  auto is_float = [&](int k) { return ply_is_float(ve.props[static_cast<std::size_t>(k)].type); };
  if (ve.ascii || !is_float(ve.ix) || !is_float(ve.iy) || !is_float(ve.iz)) return l;
  std::vector<std::size_t> offs(ve.props.size());
  for (std::size_t k = 0; k < ve.props.size(); ++k)
    offs[k] = l.stride, l.stride += static_cast<std::size_t>(ply_type_size(ve.props[k].type));
  l.offset = {offs[static_cast<std::size_t>(ve.ix)], offs[static_cast<std::size_t>(ve.iy)],
              offs[static_cast<std::size_t>(ve.iz)]};
  l.usable = true;
  return l;
}

// Throws naming the first vertex of `c` with a NaN or infinite coordinate. The common layout
// (records of exactly x, y, z) is scanned as one run of floats for an all-ones exponent first.
inline void check_float_finite(const float_cloud& c, const std::string& path) {
  const std::size_t n = c.kdtree_get_point_count();
  bool bad = false;
  for (std::size_t i = 0; i < n && !bad; i += 4096) {  // blocks: stop soon after a bad one
    const std::size_t e = std::min(n, i + 4096);
    bool any = false;
    for (std::size_t r = i; r < e; ++r)
      for (std::size_t d = 0; d < 3; ++d) {
        std::uint32_t u;
        const float f = c.coord(r, d);
        std::memcpy(&u, &f, 4);
        any |= (u & 0x7f800000u) == 0x7f800000u;
      }
    bad = any;
  }
  if (!bad) return;
  for (std::size_t r = 0; r < n; ++r) {
    const float x = c.coord(r, 0), y = c.coord(r, 1), z = c.coord(r, 2);
    check(std::isfinite(x) && std::isfinite(y) && std::isfinite(z), "read_ply: '", path,
          "' vertex ", r, " is (", x, ", ", y, ", ", z, "), expected finite coordinates");
  }
}

// A read-only stream over bytes in memory (the header parser's input for a mapped file): tellg
// and seekg work within the bytes; a seek outside them fails.
class memory_buf : public std::streambuf {
 public:
  memory_buf(const char* data, std::size_t size) {
    char* p = const_cast<char*>(data);  // the get area is only read
    setg(p, p, p + size);
  }

 protected:
  pos_type seekoff(off_type off, std::ios_base::seekdir dir,
                   std::ios_base::openmode which) override {
    if (!(which & std::ios_base::in)) return pos_type(off_type(-1));
    const off_type size = egptr() - eback();
    const off_type base = dir == std::ios_base::beg   ? 0
                          : dir == std::ios_base::cur ? gptr() - eback()
                                                      : size;
    if (off > size || off < -size) return pos_type(off_type(-1));
    const off_type to = base + off;
    if (to < 0 || to > size) return pos_type(off_type(-1));
    setg(eback(), eback() + to, egptr());
    return pos_type(to);
  }
  pos_type seekpos(pos_type pos, std::ios_base::openmode which) override {
    return seekoff(off_type(pos), std::ios_base::beg, which);
  }
};

// A file read through a stream buffer by position (pread) when it is a regular file, by read()
// otherwise (a FIFO, a device). Opening never blocks (O_NONBLOCK, cleared once open: a FIFO with
// no writer reads as empty); a directory is refused by name; a regular file that ends before the
// length it had when opened throws tightfit::error naming it (truncated while read), which the
// readers' istreams pass on (badbit in their exception mask). Large reads go straight into the
// destination; seeking works on regular files.
class file_buf : public std::streambuf {
 public:
  file_buf(const std::string& path, const char* who) : path_(path) {
#if defined(TIGHTFIT_CLOUD_IO_POSIX)
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    check(fd_ >= 0, who, ": cannot open '", path, "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || S_ISDIR(st.st_mode)) {
      const bool dir = S_ISDIR(st.st_mode);
      ::close(fd_);
      fd_ = -1;
      fail(who, ": '", path, "' ", dir ? "is a directory, expected a file" : "cannot be read");
    }
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) (void)::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
    regular_ = S_ISREG(st.st_mode);
    length_ = regular_ ? static_cast<long long>(st.st_size) : -1;
#else
    std::error_code ec;
    check(!std::filesystem::is_directory(path, ec), who, ": '", path,
          "' is a directory, expected a file");
    in_.open(path, std::ios::binary);
    check(in_.good(), who, ": cannot open '", path, "'");
    length_ = file_length(path);
#endif
    setg(buf_, buf_, buf_);
  }
  file_buf(const file_buf&) = delete;
  file_buf& operator=(const file_buf&) = delete;
  ~file_buf() override {
#if defined(TIGHTFIT_CLOUD_IO_POSIX)
    if (fd_ >= 0) ::close(fd_);
#endif
  }
  /// The file's length when it was opened; -1 for a stream of unknown length.
  long long length() const {
    return length_;
  }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    const std::size_t got = fill(buf_, sizeof buf_);
    setg(buf_, buf_, buf_ + got);
    return got == 0 ? traits_type::eof() : traits_type::to_int_type(*gptr());
  }
  std::streamsize xsgetn(char* s, std::streamsize n) override {
    std::streamsize done = 0;
    const std::streamsize buffered = std::min<std::streamsize>(n, egptr() - gptr());
    if (buffered > 0) {
      std::memcpy(s, gptr(), static_cast<std::size_t>(buffered));
      gbump(static_cast<int>(buffered));
      done = buffered;
    }
    while (done < n) {  // the rest straight into the destination
      const std::size_t got = fill(s + done, static_cast<std::size_t>(n - done));
      if (got == 0) break;
      done += static_cast<std::streamsize>(got);
    }
    return done;
  }
  pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode) override {
    if (!regular_) return pos_type(off_type(-1));
    const off_type here = static_cast<off_type>(pos_) - (egptr() - gptr());
    const off_type base = dir == std::ios_base::beg   ? 0
                          : dir == std::ios_base::cur ? here
                                                      : static_cast<off_type>(length_);
    if ((off > 0 && base > std::numeric_limits<off_type>::max() - off) || base + off < 0)
      return pos_type(off_type(-1));
    pos_ = static_cast<long long>(base + off);
    setg(buf_, buf_, buf_);
    return pos_type(base + off);
  }
  pos_type seekpos(pos_type pos, std::ios_base::openmode which) override {
    return seekoff(off_type(pos), std::ios_base::beg, which);
  }

 private:
  // Reads up to n bytes at the current file position; 0 at the end.
  std::size_t fill(char* dst, std::size_t n) {
#if defined(TIGHTFIT_CLOUD_IO_POSIX)
    for (;;) {
      const ::ssize_t got =
          regular_ ? ::pread(fd_, dst, n, static_cast<::off_t>(pos_)) : ::read(fd_, dst, n);
      if (got < 0 && errno == EINTR) continue;
      check(got >= 0, "'", path_, "': cannot read at byte ", pos_, ": ", std::strerror(errno));
      if (got == 0 && regular_ && pos_ < length_)
        fail("'", path_, "': the file ends at byte ", pos_, ", but it had ", length_,
             " bytes when it was opened (truncated while it was read?)");
      pos_ += got;
      return static_cast<std::size_t>(got);
    }
#else
    in_.read(dst, static_cast<std::streamsize>(n));
    const auto got = static_cast<std::size_t>(in_.gcount());
    pos_ += static_cast<long long>(got);
    return got;
#endif
  }

  std::string path_;
#if defined(TIGHTFIT_CLOUD_IO_POSIX)
  int fd_ = -1;
#else
  std::ifstream in_;
#endif
  bool regular_ = false;
  long long length_ = -1;
  long long pos_ = 0;  // file position of egptr()
  char buf_[1 << 16];
};

// A file opened for the readers: its buffer and an istream over it that passes on the buffer's
// errors (badbit in the exception mask).
struct file_input {
  file_buf buf;
  std::istream in;
  file_input(const std::string& path, const char* who) : buf(path, who), in(&buf) {
    in.exceptions(std::ios::badbit);
  }
};
}  // namespace detail

/// Reads the vertices of a PLY from a binary stream (see read_ply) as stored_cloud: a binary PLY
/// with float x, y and z becomes a float_cloud (one read() when the vertices are exactly x, y, z;
/// strided otherwise), anything else `points`. The same checks and errors as read_ply.
inline stored_cloud read_ply_stored(std::istream& in, const std::string& path, long long length,
                                    std::size_t max_points = unlimited_points) {
  const detail::ply_vertices ve = detail::read_ply_header(in, path, length, max_points);
  const detail::float_layout lay = detail::float_layout_of(ve);
  if (!lay.usable) return detail::read_ply_points(in, path, ve);  // ascii or double: widened
  const std::size_t stride = lay.stride;
  const auto ox = lay.offset[0], oy = lay.offset[1], oz = lay.offset[2];
  std::vector<float> xyz;  // (count, 3) row-major
  auto ends = [&](std::size_t done) {
    fail("read_ply: '", path, "' ends after ", done, " of ", ve.count, " vertices");
  };
  if (stride == 12 && ox == 0 && oy == 4 && oz == 8 && length >= 0) {
    // exactly x, y, z and a known length (the count was checked against it): one read
    xyz.resize(3 * ve.count);
    in.read(reinterpret_cast<char*>(xyz.data()), static_cast<std::streamsize>(12 * ve.count));
    const auto got = static_cast<std::size_t>(in.gcount());
    if (got != 12 * ve.count) ends(got / 12);
  } else {
    // in chunks of at most 2^16 vertices: memory follows the data actually present
    const std::size_t chunk = 1u << 16;
    std::vector<char> buf(stride * std::min(ve.count, chunk));
    xyz.reserve(3 * std::min<std::size_t>(ve.count, 1u << 20));
    for (std::size_t done = 0; done < ve.count;) {
      const std::size_t n = std::min(chunk, ve.count - done);
      in.read(buf.data(), static_cast<std::streamsize>(n * stride));
      const auto got = static_cast<std::size_t>(in.gcount());
      if (got != n * stride) ends(done + got / stride);
      for (std::size_t r = 0; r < n; ++r)
        for (const auto o : {ox, oy, oz}) {
          float f;
          std::memcpy(&f, buf.data() + r * stride + o, 4);
          xyz.push_back(f);
        }
      done += n;
    }
  }
  float_cloud out(std::move(xyz));
  detail::check_float_finite(out, path);
  return out;
}

/// Reads a PLY held in memory (`bytes`: memory the caller owns, not a mapped file, which another
/// process could truncate under the view) as stored_cloud: a binary PLY with float x, y and z
/// becomes a float_cloud that views `bytes` in place (any record layout, no copy; `owner` keeps
/// them alive), anything else `points`. The same checks and errors as
/// read_ply; every size is checked against bytes.size().
inline stored_cloud read_ply_stored(std::span<const char> bytes, std::shared_ptr<const void> owner,
                                    const std::string& path,
                                    std::size_t max_points = unlimited_points) {
  detail::memory_buf buf(bytes.data(), bytes.size());
  std::istream in(&buf);
  const auto length = static_cast<long long>(bytes.size());
  const detail::ply_vertices ve = detail::read_ply_header(in, path, length, max_points);
  const detail::float_layout lay = detail::float_layout_of(ve);
  if (!lay.usable) return detail::read_ply_points(in, path, ve);  // ascii or double: widened
  const auto at = static_cast<long long>(in.tellg());             // the first vertex
  check(at >= 0 && at <= length, "read_ply: '", path, "': cannot locate the vertex data");
  const auto left = static_cast<std::size_t>(length - at);
  if (ve.count > left / lay.stride)  // read_ply_header checked this already; kept as a guard
    fail("read_ply: '", path, "' ends after ", left / lay.stride, " of ", ve.count, " vertices");
  float_cloud out(
      std::move(owner),
      reinterpret_cast<const unsigned char*>(bytes.data()) + static_cast<std::size_t>(at), ve.count,
      lay.stride, lay.offset);
  detail::check_float_finite(out, path);
  return out;
}

namespace detail {
// Whether the first three fields name x, y and z (any case, optionally with a suffix such as
// "x_m" or "X [mm]"): the header line read_xyz allows.
inline bool xyz_header(const std::string (&tok)[3]) {
  const char want[3] = {'x', 'y', 'z'};
  for (int k = 0; k < 3; ++k) {
    const std::string& t = tok[k];
    if (t.empty() || std::tolower(static_cast<unsigned char>(t[0])) != want[k]) return false;
    if (t.size() > 1 && std::isalpha(static_cast<unsigned char>(t[1]))) return false;
  }
  return true;
}
}  // namespace detail

/// Reads XYZ/CSV text from a binary stream: the first three numbers of every non-empty,
/// non-comment line. A first line that is not three numbers is an error unless it names x, y and
/// z (a header); a line longer than max_line_bytes is an error, and so is a point beyond
/// `max_points`. `path` names it in messages.
inline points read_xyz(std::istream& in, const std::string& path,
                       std::size_t max_points = unlimited_points) {
  points out;
  std::string line;
  long long lineno = 0;
  bool first = true;
  while (detail::bounded_getline(in, line, path, "read_xyz", lineno + 1)) {
    ++lineno;
    for (auto& ch : line)
      if (ch == ',' || ch == ';' || ch == '\t' || ch == '\r') ch = ' ';
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string tok[3];
    ls >> tok[0];
    if (tok[0].empty()) continue;
    ls >> tok[1] >> tok[2];
    double v[3];
    bool ok = true;
    for (int k = 0; k < 3; ++k) {
      char* end = nullptr;
      v[k] = std::strtod(tok[k].c_str(), &end);
      ok = ok && !tok[k].empty() && end && *end == '\0';
    }
    if (!ok && first && detail::xyz_header(tok)) {  // one header line ("x,y,z") is allowed
      first = false;
      continue;
    }
    first = false;
    check(ok, "read_xyz: '", path, "' line ", lineno, ": expected three numbers, got '",
          line.substr(0, 60), "'");
    const point3 p(v[0], v[1], v[2]);
    check(out.size() < max_points, "read_xyz: '", path, "' line ", lineno,
          ": more points than the limit of ", max_points);
    check(p.allFinite(), "read_xyz: '", path, "' line ", lineno, ": point (", v[0], ", ", v[1],
          ", ", v[2], ") is not finite");
    out.push_back(p);
  }
  return out;
}

/// Reads the vertices (x, y, z) of a PLY file (by position: see the top comment).
inline points read_ply(const std::string& path, std::size_t max_points = unlimited_points) {
  detail::file_input f(path, "read_ply");
  return read_ply(f.in, path, f.buf.length(), max_points);
}

/// Reads XYZ/CSV text from a file (see the stream version).
inline points read_xyz(const std::string& path, std::size_t max_points = unlimited_points) {
  detail::file_input f(path, "read_xyz");
  return read_xyz(f.in, path, max_points);
}

namespace detail {
inline bool has_ply_extension(const std::string& path) {
  const auto dot = path.find_last_of('.');
  std::string ext = dot == std::string::npos ? "" : path.substr(dot + 1);
  for (auto& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return ext == "ply";
}
}  // namespace detail

/// Reads a cloud by extension: .ply, otherwise XYZ/CSV text.
inline points read_cloud(const std::string& path, std::size_t max_points = unlimited_points) {
  return detail::has_ply_extension(path) ? read_ply(path, max_points) : read_xyz(path, max_points);
}

/// Reads a cloud by extension as its file stores it (see read_ply_stored): .ply, otherwise
/// XYZ/CSV text (as `points`). The file is read by position (see the top comment): a float PLY
/// becomes a float_cloud that owns its coordinates.
inline stored_cloud read_cloud_stored(const std::string& path,
                                      std::size_t max_points = unlimited_points) {
  if (!detail::has_ply_extension(path)) return read_xyz(path, max_points);
  detail::file_input f(path, "read_ply");
  return read_ply_stored(f.in, path, f.buf.length(), max_points);
}

/// Writes a binary little-endian PLY with double x, y, z.
inline void write_ply(const std::string& path, const points& p) {
  std::ofstream out(path, std::ios::binary);
  check(out.good(), "write_ply: cannot open '", path, "'");
  out << "ply\nformat binary_little_endian 1.0\nelement vertex " << p.size()
      << "\nproperty double x\nproperty double y\nproperty double z\nend_header\n";
  for (const auto& q : p) out.write(reinterpret_cast<const char*>(q.data()), 3 * sizeof(double));
  check(out.good(), "write_ply: writing '", path, "' failed");
}

/// Writes XYZ text (one "x y z" line per point, 17 significant digits).
inline void write_xyz(const std::string& path, const points& p) {
  std::ofstream out(path);
  check(out.good(), "write_xyz: cannot open '", path, "'");
  out.precision(17);
  for (const auto& q : p) out << q.x() << ' ' << q.y() << ' ' << q.z() << '\n';
  check(out.good(), "write_xyz: writing '", path, "' failed");
}

}  // namespace tightfit::geometry
