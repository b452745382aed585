// End-to-end tests of `tightfit measure` on bad and untrusted input (issues 12 and 13): every
// input is written by the test; each run expects the documented exit code (0 ok, 1 bad input,
// 2 bad arguments, 3 a measurement that is not trustworthy) and one line naming the problem,
// under the memory limit of run_limited where an allocation before validation would show.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cli/cli_testing.hpp"

using namespace tightfit::cli_testing;

namespace {

// single-quoted for the shell (built by appends: GCC 12 warns on cli_testing's q() inlined here)
std::string sq(const fs::path& p) {
  std::string s(1, '\'');
  s.append(p.string());
  s.push_back('\'');
  return s;
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

// A box of (l, w, h) metres on the belt z = 0 seen from 1.5 m above (top face and belt), as
// XYZ text scaled by `unit` (1: metres, 1000: millimetres).
void write_box_scan(const fs::path& p, double l, double w, double h, double unit, int step = 1) {
  std::ofstream out(p);
  std::mt19937 gen(3);
  std::normal_distribution<double> noise(0.0, 0.0015);
  const double cam = 1.5, f = 570;
  for (int j = 0; j < 480; j += step)
    for (int i = 0; i < 640; i += step) {
      const double rx = (i - 319.5) / f, ry = (j - 239.5) / f;
      double d = cam;
      if (std::abs(rx * (cam - h)) <= l / 2 && std::abs(ry * (cam - h)) <= w / 2) d = cam - h;
      d += noise(gen);
      out << rx * d * unit << ' ' << ry * d * unit << ' ' << (cam - d) * unit << '\n';
    }
}

}  // namespace

TEST_CASE("measure: a PLY claiming 10^8 vertices fails fast, naming the count") {
  const auto dir = scratch("measure-ply");
  {
    const char head[] =
        "ply\nformat binary_little_endian 1.0\nelement vertex 100000000\nproperty float x\n"
        "property float y\nproperty float z\nend_header\n";
    std::ofstream out(dir / "big.ply", std::ios::binary);
    out << head;
    for (std::size_t k = sizeof head - 1; k < 243; ++k) out.put('\x01');  // 243 bytes in all
  }
  const auto r = run_limited("measure " + sq(dir / "big.ply"));
  CHECK(r.code == 1);
  CHECK(r.err.find("100000000") != std::string::npos);
  CHECK(lines(r.err) == 1);
  // a face element of 2^62 entries before the vertices: refused, not wrapped to 0
  write_text(dir / "face.ply",
             "ply\nformat binary_little_endian 1.0\nelement face 4611686018427387904\n"
             "property uchar a\nelement vertex 1\nproperty float x\nproperty float y\n"
             "property float z\nend_header\n0123456789ab");
  const auto f = run_limited("measure " + sq(dir / "face.ply"));
  CHECK(f.code == 1);
  CHECK(f.err.find("4611686018427387904") != std::string::npos);
}

TEST_CASE("measure: /dev/zero and a line without end are errors, not unbounded memory") {
  for (std::string name : {"zero.ply", "zero.xyz"}) {
    const auto dir = scratch("measure-zero");
    fs::remove(dir / name);
    fs::create_symlink("/dev/zero", dir / name);
    const auto r = run_limited("measure " + sq(dir / name));
    CAPTURE(name);
    CHECK(r.code == 1);
    CHECK(r.err.find("longer than") != std::string::npos);
  }
  const auto dir = scratch("measure-long");
  {
    std::ofstream out(dir / "long.xyz");
    out << "0 0 0\n";
    for (int k = 0; k < 200000; ++k) out.put('1');
    out << '\n';
  }
  const auto r = run_limited("measure " + sq(dir / "long.xyz"));
  CHECK(r.code == 1);
  CHECK(r.err.find("line 2 is longer than") != std::string::npos);
}

TEST_CASE("measure: a first XYZ line that is not numbers is an error unless it names x y z") {
  const auto dir = scratch("measure-header");
  write_text(dir / "bad.xyz", "hello world again\n0 0 0\n1 1 1\n");
  const auto r = run("measure " + sq(dir / "bad.xyz"));
  CHECK(r.code == 1);
  CHECK(r.err.find("line 1") != std::string::npos);
}

TEST_CASE("measure: millimetres without --unit mm get a hint; with it, the box") {
  const auto dir = scratch("measure-mm");
  write_box_scan(dir / "box_mm.xyz", 0.6, 0.4, 0.25, 1000, 2);
  const auto r = run("measure " + sq(dir / "box_mm.xyz"));
  CHECK(r.code != 0);
  CHECK(r.err.find("--unit mm") != std::string::npos);
  const auto ok = run("measure --json --unit mm " + sq(dir / "box_mm.xyz"));
  CHECK(ok.code == 0);
  const auto j = nlohmann::json::parse(ok.out);
  CHECK(j["status"] == "ok");
  CHECK(std::abs(j["length"].get<double>() - 600) < 10);
  CHECK(j["uncertainty_95"].size() == 3);
}

TEST_CASE("measure: untrusted measurements exit 3 with their reasons; several files one by one") {
  const auto dir = scratch("measure-status");
  // a line of points: degenerate, never an ok box
  {
    std::ofstream out(dir / "line.xyz");
    for (int i = 0; i < 2000; ++i) out << 0.0003 * i << ' ' << 0.0002 * i << " 0.5\n";
  }
  const auto r = run("measure --belt none " + sq(dir / "line.xyz"));
  CHECK(r.code == 3);
  CHECK(r.out.find("degenerate_shape") != std::string::npos);
  // a good scan, a bad file and the line: one JSON array, the bad file on stderr, exit 1
  write_box_scan(dir / "box.xyz", 0.6, 0.4, 0.25, 1, 2);
  write_text(dir / "broken.xyz", "1 2\n");
  const auto many = run("measure --json " + sq(dir / "box.xyz") + " " + sq(dir / "broken.xyz") +
                        " " + sq(dir / "line.xyz"));
  CHECK(many.code == 1);
  CHECK(lines(many.err) == 1);
  const auto j = nlohmann::json::parse(many.out);
  REQUIRE(j.size() == 2);
  CHECK(j[0]["status"] == "ok");
  CHECK(j[1]["status"] != "ok");
}

TEST_CASE("measure: JSON escapes file names; a failed write to stdout exits 1") {
  const auto dir = scratch("measure-json");
  const fs::path odd = dir / "a \"quoted\"\nname.xyz";
  write_box_scan(odd, 0.5, 0.35, 0.2, 1, 2);
  const auto r = run("measure --json '" + odd.string() + "'");
  CHECK(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);  // valid JSON
  CHECK(j["file"] == odd.string());
  const auto full = run_with("", "measure '" + odd.string() + "'", "/dev/full");
  CHECK(full.code == 1);
  CHECK(full.err.find("standard output") != std::string::npos);
}
