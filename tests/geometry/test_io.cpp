// PLY (ASCII, binary little-endian; float/double; extra properties and elements) and XYZ/CSV
// reading, and every malformed-file error.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <variant>

#if defined(__unix__)
#include <sys/stat.h>
#endif

#include "geometry/support.hpp"
#include "tightfit/geometry/cloud_io.hpp"
#include "tightfit/geometry/measure.hpp"

namespace tg = tightfit::geometry;

namespace {
void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}
template <class T>
void put(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  s.append(b, sizeof(T));
}
// A vertex record with float x, y, z among other properties, out of order (read strided).
constexpr const char* strided_properties =
    "property uchar flag\nproperty float z\nproperty float x\nproperty double i\n"
    "property float y\n";
// Two records of that layout: the points (0.5, -1, 2.5) and (1.5, -1, 2.5).
void put_strided_vertices(std::string& s) {
  for (int i = 0; i < 2; ++i) {
    put(s, static_cast<unsigned char>(1));
    put(s, 2.5f);
    put(s, 0.5f + static_cast<float>(i));
    put(s, 9.0);
    put(s, -1.0f);
  }
}
}  // namespace

TEST_CASE("binary PLY written by write_ply reads back exactly") {
  const std::string path = tg::test::temp_path("roundtrip.ply");
  const tg::points p{{1.5, -2.25, 3.125}, {1e-9, 7, -0.1}, {0, 0, 0}};
  tg::write_ply(path, p);
  const auto q = tg::read_cloud(path);
  REQUIRE(q.size() == p.size());
  for (std::size_t i = 0; i < p.size(); ++i) CHECK(q[i] == p[i]);
  std::remove(path.c_str());
}

TEST_CASE("ASCII PLY with extra properties and a face element") {
  const std::string path = tg::test::temp_path("ascii.ply");
  write_text(path,
             "ply\r\nformat ascii 1.0\r\ncomment made by hand\r\nelement vertex 2\r\n"
             "property float x\r\nproperty float y\r\nproperty float z\r\nproperty uchar red\r\n"
             "element face 1\r\nproperty list uchar int vertex_indices\r\nend_header\r\n"
             "1 2 3 255\r\n4.5 5 6 0\r\n3 0 1 1\r\n");
  const auto q = tg::read_ply(path);
  REQUIRE(q.size() == 2);
  CHECK(q[1] == tg::point3(4.5, 5, 6));
  std::remove(path.c_str());
}

TEST_CASE("binary PLY with float coordinates among other properties") {
  const std::string path = tg::test::temp_path("float.ply");
  std::string s =
      "ply\nformat binary_little_endian 1.0\nelement camera 1\nproperty double fx\n"
      "element vertex 2\nproperty uchar flag\nproperty float x\nproperty float y\n"
      "property float z\nproperty double intensity\nend_header\n";
  put(s, 570.0);
  for (int i = 0; i < 2; ++i) {
    put(s, static_cast<unsigned char>(1));
    put(s, 0.5f + static_cast<float>(i));
    put(s, -1.0f);
    put(s, 2.0f);
    put(s, 9.0);
  }
  write_text(path, s);
  const auto q = tg::read_ply(path);
  REQUIRE(q.size() == 2);
  CHECK(q[1] == tg::point3(1.5, -1, 2));
  // truncated
  write_text(path, s.substr(0, s.size() - 5));
  CHECK_THROWS_WITH_AS(tg::read_ply(path), doctest::Contains("claims 2 entries"), tightfit::error);
  std::remove(path.c_str());
}

TEST_CASE("read_ply_stored keeps float coordinates as a float_cloud, the same values as read_ply") {
  const std::string path = tg::test::temp_path("stored.ply");
  auto as_float = [&](long long length) {
    std::ifstream in(path, std::ios::binary);
    return std::get<tg::float_cloud>(tg::read_ply_stored(in, path, length));
  };
  auto check_same = [&](const tg::float_cloud& c) {
    const auto p = tg::read_ply(path);
    REQUIRE(c.kdtree_get_point_count() == p.size());
    for (std::size_t i = 0; i < p.size(); ++i) CHECK(tg::point_at(c, i) == p[i]);
  };
  // exactly x, y, z (one read) and the same through a stream of unknown length (chunks)
  std::string s =
      "ply\nformat binary_little_endian 1.0\nelement vertex 3\nproperty float x\n"
      "property float y\nproperty float z\nend_header\n";
  for (int i = 0; i < 9; ++i) put(s, 0.1f * static_cast<float>(i) - 0.3f);
  write_text(path, s);
  check_same(as_float(static_cast<long long>(s.size())));
  check_same(as_float(-1));
  CHECK(std::get<tg::float_cloud>(tg::read_cloud_stored(path)).coord(1, 1) == 0.1f * 4 - 0.3f);
  // scaled as read: the same double as widening, then multiplying
  tg::float_cloud c = as_float(-1);
  c.set_scale(0.001);
  CHECK(c.kdtree_get_pt(2, 1) == static_cast<double>(0.1f * 7 - 0.3f) * 0.001);
  CHECK_THROWS_WITH_AS(c.set_scale(0), doctest::Contains("scale is 0"), tightfit::error);
  // truncated, and a NaN coordinate
  write_text(path, s.substr(0, s.size() - 1));
  CHECK_THROWS_WITH_AS(as_float(static_cast<long long>(s.size() - 1)),
                       doctest::Contains("claims 3 entries"), tightfit::error);
  CHECK_THROWS_WITH_AS(as_float(-1), doctest::Contains("ends after 2 of 3 vertices"),
                       tightfit::error);
  std::string bad = s;
  const float nan = std::nanf("");
  std::memcpy(bad.data() + bad.size() - 8, &nan, 4);
  write_text(path, bad);
  CHECK_THROWS_WITH_AS(tg::read_cloud_stored(path), doctest::Contains("vertex 2 is"),
                       tightfit::error);
  // float x, y, z among other properties (strided)
  std::string t = "ply\nformat binary_little_endian 1.0\nelement vertex 2\n" +
                  std::string(strided_properties) + "end_header\n";
  put_strided_vertices(t);
  write_text(path, t);
  check_same(as_float(static_cast<long long>(t.size())));
  CHECK(tg::point_at(as_float(-1), 1) == tg::point3(1.5, -1, 2.5));
  // double coordinates and ASCII stay points (widened as before)
  tg::write_ply(path, tg::points{{1.5, -2.25, 3.125}});
  CHECK(std::get<tg::points>(tg::read_cloud_stored(path)) == tg::read_ply(path));
  write_text(path,
             "ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\n"
             "property float z\nend_header\n1 2 3\n");
  CHECK(std::get<tg::points>(tg::read_cloud_stored(path))[0] == tg::point3(1, 2, 3));
  std::remove(path.c_str());
}

TEST_CASE("read_cloud_stored reads a float PLY by position, with the stream's errors") {
  const std::string path = tg::test::temp_path("mapped.ply");
  auto same_as_stream = [&](const tg::float_cloud& c) {
    std::ifstream in(path, std::ios::binary);
    const auto s = std::get<tg::float_cloud>(tg::read_ply_stored(in, path, -1));
    REQUIRE(c.kdtree_get_point_count() == s.kdtree_get_point_count());
    for (std::size_t i = 0; i < s.kdtree_get_point_count(); ++i)
      CHECK(tg::point_at(c, i) == tg::point_at(s, i));
  };
  // exactly x, y, z, after a header of odd length (the floats are not 4-byte aligned)
  std::string s =
      "ply\nformat binary_little_endian 1.0\ncomment odd\nelement vertex 3\nproperty float x\n"
      "property float y\nproperty float z\nend_header\n";
  REQUIRE(s.size() % 4 != 0);
  for (int i = 0; i < 9; ++i) put(s, 0.25f * static_cast<float>(i) - 1.0f);
  write_text(path, s);
  tg::float_cloud kept;
  {
    const auto c = std::get<tg::float_cloud>(tg::read_cloud_stored(path));
    same_as_stream(c);
    CHECK(c.coord(2, 0) == 0.25f * 6 - 1.0f);
    kept = c;  // a copy shares the coordinates
  }
  std::remove(path.c_str());  // the coordinates outlive the file and the first cloud
  CHECK(tg::point_at(kept, 2) == tg::point3(0.5, 0.75, 1.0));
  // float x, y, z among other properties, after an element before the vertices: viewed strided
  std::string t =
      "ply\nformat binary_little_endian 1.0\nelement camera 1\nproperty double fx\n"
      "element vertex 2\n" +
      std::string(strided_properties) + "end_header\n";
  put(t, 570.0);
  put_strided_vertices(t);
  write_text(path, t);
  same_as_stream(std::get<tg::float_cloud>(tg::read_cloud_stored(path)));
  CHECK(tg::point_at(std::get<tg::float_cloud>(tg::read_cloud_stored(path)), 1) ==
        tg::point3(1.5, -1, 2.5));
  // no vertices at all: an empty cloud
  write_text(path,
             "ply\nformat binary_little_endian 1.0\nelement vertex 0\nproperty float x\n"
             "property float y\nproperty float z\nend_header\n");
  CHECK(std::get<tg::float_cloud>(tg::read_cloud_stored(path)).kdtree_get_point_count() == 0);
  // malformed and truncated files: the same clear errors as the stream reader
  std::string nan_last = s, inf_first = t;
  const float nan = std::nanf(""), inf = HUGE_VALF;
  std::memcpy(nan_last.data() + nan_last.size() - 8, &nan, 4);             // vertex 2's y
  std::memcpy(inf_first.data() + inf_first.size() - 2 * 21 + 1, &inf, 4);  // vertex 0's z
  const std::string cases[][2] = {
      {"", "expected 'ply'"},
      {"ply\n", "no end_header"},
      {s.substr(0, s.find("end_header")), "no end_header"},  // cut before the header ends
      {s.substr(0, 60), "bad element line"},                 // cut inside a header line
      {s.substr(0, s.size() - 1), "claims 3 entries"},
      {s.substr(0, s.size() - 36), "claims 3 entries"},  // the header alone
      {t.substr(0, t.size() - 30), "claims 2 entries"},
      {"ply\nformat binary_little_endian 1.0\nelement vertex 1000000000\nproperty float x\n"
       "property float y\nproperty float z\nend_header\n0123456789ab",
       "claims 1000000000 entries"},
      {"ply\nformat binary_big_endian 1.0\nelement vertex 1\nproperty float x\nproperty float "
       "y\nproperty float z\nend_header\n0123456789ab",
       "binary_big_endian"},
      {"ply\nformat binary_little_endian 1.0\nelement vertex 1\nproperty float x\nproperty "
       "float y\nend_header\n01234567",
       "lacks x, y or z"},
      {"ply\n" + std::string(70000, 'a'), "longer than"},
      {nan_last, "vertex 2 is (0.5, nan, 1)"},
      {inf_first, "vertex 0 is (0.5, -1, inf)"},
  };
  for (const auto& c : cases) {
    CAPTURE(c[1]);
    write_text(path, c[0]);
    CHECK_THROWS_WITH_AS(tg::read_cloud_stored(path), doctest::Contains(c[1].c_str()),
                         tightfit::error);
  }
  CHECK_THROWS_WITH_AS(tg::read_cloud_stored(tg::test::temp_path("does_not_exist.ply")),
                       doctest::Contains("cannot open"), tightfit::error);
  // in memory: every prefix of a valid file is either read whole or refused with an error
  for (const std::string* full : {&s, &t})
    for (std::size_t len = 0; len <= full->size(); ++len) {
      CAPTURE(len);
      try {
        const auto c = tg::read_ply_stored(std::span<const char>(full->data(), len), nullptr, path);
        CHECK(len == full->size());
        CHECK(std::get<tg::float_cloud>(c).kdtree_get_point_count() == (full == &s ? 3u : 2u));
      } catch (const tightfit::error& e) {
        CHECK(std::string(e.what()).find("read_ply: '" + path + "'") != std::string::npos);
      }
    }
  std::remove(path.c_str());
}

TEST_CASE("a fixture scan measured as a float_cloud gives the same measurement as its points") {
  const std::string path = std::string(TIGHTFIT_MEBB_FIXTURES) + "/bag_006.ply";
  if (!std::filesystem::exists(path)) {
    const char* ci = std::getenv("CI");
    if (ci && std::string(ci) == "true") FAIL("MEBB fixture not found: " << path << " (CI=true)");
    MESSAGE("MEBB fixture not found: " << path << ": skipped");
    return;
  }
  const auto stored = tg::read_cloud_stored(path);
  REQUIRE(std::holds_alternative<tg::float_cloud>(stored));
  const tg::measurement a = tg::measure(std::get<tg::float_cloud>(stored));
  const tg::measurement b = tg::measure(tg::read_ply(path));
  CHECK(a.status == b.status);
  CHECK(a.reasons == b.reasons);
  CHECK(a.points_used == b.points_used);
  for (int k = 0; k < 3; ++k) {
    CHECK(a.dims[k] == b.dims[k]);
    CHECK(a.uncertainty[k] == b.uncertainty[k]);
  }
  CHECK(a.box.centre == b.box.centre);
  CHECK(a.box.rotation == b.box.rotation);
  REQUIRE(a.belt.has_value() == b.belt.has_value());
  if (a.belt) CHECK(a.belt->normal == b.belt->normal);
}

TEST_CASE("malformed PLY files raise a clear error") {
  const std::string path = tg::test::temp_path("bad.ply");
  const char* cases[][2] = {
      {"plx\n", "expected 'ply'"},
      {"ply\nformat binary_big_endian 1.0\nelement vertex 1\nproperty float x\nproperty float y\n"
       "property float z\nend_header\n",
       "binary_big_endian"},
      {"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\nend_header\n1 "
       "2\n",
       "lacks x, y or z"},
      {"ply\nformat ascii 1.0\nelement vertex 1\nproperty int x\nproperty float y\nproperty float "
       "z\n"
       "end_header\n1 2 3\n",
       "expected float or double"},
      {"ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\nproperty "
       "float z\n"
       "end_header\n1 2 3\n",
       "claims 2 entries"},
      {"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\nproperty "
       "float z\n"
       "end_header\n1 abc 3\n",
       "expected a number"},
      {"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\nproperty "
       "float z\n"
       "end_header\n1 nan 3\n",
       "expected finite"},
      {"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\n", "no end_header"},
      // a header token too many, too few or malformed (issue 35): never read as something else
      {"ply\nformat ascii 1.0\nelement vertex 46013abc\nproperty float x\n", "bad element line"},
      {"ply\nformat ascii 1.0\nelement vertex 46013 999\nproperty float x\n", "bad element line"},
      {"ply\nformat ascii 1.0\nelement vertex 0x10\nproperty float x\n", "bad element line"},
      {"ply\nformat ascii 1.0\nelement vertex -1\nproperty float x\n", "bad element line"},
      {"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\nproperty "
       "float z junk\nend_header\n1 2 3\n",
       "bad property line"},
      {"ply\nformat ascii 1.0 extra\nelement vertex 1\n", "bad format line"},
      {"ply\nformat ascii\nelement vertex 1\n", "bad format line"},
      {"ply\nformat ascii 2.0\nelement vertex 1\n", "bad format line"},
      {"ply\nformat ascii 1.0\nelement vertex 1\nproperty list uchar x\n", "bad property line"},
      {"ply\nformat ascii 1.0\nelement vertex 1\nproprety float x\n", "unknown keyword"},
      {"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\nproperty "
       "float z\nend_header now\n1 2 3\n",
       "bad end_header line"},
  };
  for (const auto& c : cases) {
    write_text(path, c[0]);
    CHECK_THROWS_WITH_AS(tg::read_ply(path), doctest::Contains(c[1]), tightfit::error);
  }
  CHECK_THROWS_WITH_AS(tg::read_ply(tg::test::temp_path("does_not_exist.ply")),
                       doctest::Contains("cannot open"), tightfit::error);
  std::remove(path.c_str());
}

TEST_CASE("clouds: a directory is refused by name, a FIFO without a writer does not block") {
  const std::string dir = tg::test::temp_path("cloud_dir.ply");
  std::filesystem::create_directories(dir);
  for (auto read : {+[](const std::string& p) { (void)tg::read_cloud_stored(p); },
                    +[](const std::string& p) { (void)tg::read_cloud(p); },
                    +[](const std::string& p) { (void)tg::read_xyz(p); }})
    CHECK_THROWS_WITH_AS(read(dir), doctest::Contains("is a directory"), tightfit::error);
  std::filesystem::remove(dir);
#if defined(__unix__)
  const std::string fifo = tg::test::temp_path("cloud_fifo.ply");
  std::remove(fifo.c_str());
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // no writer: the open does not wait for one, and the empty stream is no PLY
  CHECK_THROWS_WITH_AS(tg::read_cloud_stored(fifo), doctest::Contains("expected 'ply'"),
                       tightfit::error);
  std::remove(fifo.c_str());
#endif
}

TEST_CASE("clouds: max_points refuses a larger cloud before its points are read") {
  const std::string path = tg::test::temp_path("many.ply");
  tg::points p(10, tg::point3(1, 2, 3));
  tg::write_ply(path, p);
  CHECK(tg::read_ply(path, 10).size() == 10);
  CHECK_THROWS_WITH_AS(tg::read_ply(path, 9),
                       doctest::Contains("has 10 vertices, more than the limit of 9 points"),
                       tightfit::error);
  CHECK_THROWS_WITH_AS(tg::read_cloud_stored(path, 9), doctest::Contains("limit of 9"),
                       tightfit::error);
  const std::string xyz = tg::test::temp_path("many.xyz");
  tg::write_xyz(xyz, p);
  CHECK(tg::read_xyz(xyz, 10).size() == 10);
  CHECK_THROWS_WITH_AS(tg::read_cloud(xyz, 9), doctest::Contains("more points than the limit of 9"),
                       tightfit::error);
  std::remove(path.c_str());
  std::remove(xyz.c_str());
}

TEST_CASE("clouds: a file truncated while it is read ends in an error naming it, never SIGBUS") {
  // The reader runs against a file another thread shrinks to nothing: every read either completes
  // (the truncation came after it) or throws tightfit::error naming the file. A mapped reader
  // died of SIGBUS here (issue 35).
  const std::string path = tg::test::temp_path("shrinking.ply");
  tg::points p(200000);
  for (std::size_t i = 0; i < p.size(); ++i)
    p[i] = tg::point3(static_cast<double>(i % 97), static_cast<double>(i % 13), 0.5);
  int errors = 0, complete = 0;
  for (int trial = 0; trial < 40; ++trial) {
    tg::write_ply(path, p);
    std::thread shrink([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(200 * (trial % 10)));
      std::filesystem::resize_file(path, 0);
    });
    try {
      const auto c = tg::read_cloud_stored(path);
      CHECK(std::get<tg::points>(c).size() == p.size());
      ++complete;
    } catch (const tightfit::error& e) {
      CHECK(std::string(e.what()).find(path) != std::string::npos);
      ++errors;
    }
    shrink.join();
  }
  CHECK(errors + complete == 40);
  std::remove(path.c_str());
}

TEST_CASE("XYZ / CSV text") {
  const std::string path = tg::test::temp_path("cloud.csv");
  write_text(path, "x,y,z\n# comment\n1,2,3\n\n4 5 6 extra\n7\t8\t9\n");
  const auto q = tg::read_cloud(path);
  REQUIRE(q.size() == 3);
  CHECK(q[2] == tg::point3(7, 8, 9));
  write_text(path, "1 2 3\n4 5\n");
  CHECK_THROWS_WITH_AS(tg::read_xyz(path), doctest::Contains("line 2"), tightfit::error);
  write_text(path, "1 2 3\n4 inf 6\n");
  CHECK_THROWS_WITH_AS(tg::read_xyz(path), doctest::Contains("not finite"), tightfit::error);
  write_text(path, "");
  CHECK(tg::read_xyz(path).empty());
  std::remove(path.c_str());
}
