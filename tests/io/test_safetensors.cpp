// Tests of io/safetensors.hpp: writer -> reader round trips of every dtype, a hand-built file,
// the malformed corpus (tests/io/corpus, each file with the message it must produce), reader
// and writer refusals, and a cross-check with an independent Python implementation.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#if defined(__unix__)
#include <sys/stat.h>
#endif

#include "io_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/io/safetensors.hpp"

using namespace tightfit;
using tightfit::testing::contains;
using tightfit::testing::error_of;

namespace {

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

/// A safetensors image built by hand: length, header text padded with spaces, data.
std::string hand_image(const std::string& header, const std::string& data) {
  std::string h = header;
  while (h.size() % 8 != 0) h += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xffu);
  return out + h + data;
}

std::string le_bytes(std::uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += static_cast<char>((v >> (8 * i)) & 0xffu);
  return s;
}

}  // namespace

TEST_CASE("writer -> reader round trip of every dtype, in memory and through a file") {
  const auto d = tightfit::testing::uniform<double>(60, 11, -3.0, 3.0);  // (3, 4, 5)
  std::vector<float> f(d.begin(), d.end());
  f[0] = std::numeric_limits<float>::infinity();
  f[1] = -0.0f;
  f[2] = 1e-30f;  // below the f16 range, normal in bf16
  std::vector<std::int64_t> ids = {0, 1, -100, std::int64_t{1} << 40, 31999, -7};
  std::vector<std::int32_t> ids32 = {5, -100, 2147483647, -2147483647 - 1};

  safetensors_writer w;
  w.add("model.f64", {3, 4, 5}, std::span<const double>(d));
  w.add("model.f32", {60}, std::span<const float>(f));
  w.add("model.d_as_f32", {6, 10}, std::span<const double>(d), dtype::f32);
  w.add("model.bf16", {60}, std::span<const double>(d), dtype::bf16);
  w.add("model.f16", {60}, std::span<const float>(f), dtype::f16);
  w.add("ids", {2, 3}, std::span<const std::int64_t>(ids));
  w.add("ids32", {4}, std::span<const std::int32_t>(ids32));
  w.add("ids_as_i32", {2}, std::span<const std::int64_t>(ids.data(), 2), dtype::i32);
  w.add("scalar", {}, std::span<const double>(d.data(), 1));
  w.add("empty", {0, 3}, std::span<const float>());
  w.set_metadata("format", "pt");
  CHECK(w.size() == 10);

  const std::vector<std::byte> image = w.serialize();
  tightfit::testing::scratch_dir dir;
  w.write(dir / "x.safetensors");
  CHECK(std::filesystem::file_size(dir / "x.safetensors") == image.size());

  for (int pass = 0; pass < 2; ++pass) {
    safetensors_file owner;
    safetensors_view st;
    if (pass == 0) {
      st = safetensors_view::parse(image, "image");
    } else {
      owner = safetensors_file::open(dir / "x.safetensors");
      st = owner;
    }
    CAPTURE(pass);
    CHECK(st.size() == 10);
    CHECK(st.metadata().at("format") == "pt");
    CHECK(st.info("model.f64").shape == std::vector<index_t>{3, 4, 5});
    CHECK(st.info("model.bf16").type == dtype::bf16);
    CHECK(st.info("scalar").shape.empty());
    CHECK(st.info("empty").numel() == 0);

    // Layout of the reference writer: 8-aligned header, tensors contiguous from 0, each aligned
    // to its element size, larger elements first.
    std::uint64_t expected_begin = 0;
    std::size_t previous_size = 8;
    for (const tensor_info& t : st.tensors()) {
      CHECK(t.begin == expected_begin);
      CHECK(t.begin % dtype_size(t.type) == 0);
      CHECK(dtype_size(t.type) <= previous_size);
      previous_size = dtype_size(t.type);
      expected_begin = t.end;
    }
    std::uint64_t header_length = 0;
    std::memcpy(&header_length, image.data(), 8);
    CHECK(header_length % 8 == 0);
    CHECK(8 + header_length + expected_begin == image.size());

    CHECK(st.read<double>("model.f64") == d);
    CHECK(st.read<double>("scalar") == std::vector<double>{d[0]});
    const auto f32 = st.read<float>("model.f32");
    CHECK(f32 == f);  // the -0 compares equal; check its sign too
    CHECK(std::signbit(f32[1]));
    const auto d_as_f32 = st.read<double>("model.d_as_f32");
    for (std::size_t i = 0; i < d.size(); ++i)
      CHECK(d_as_f32[i] == static_cast<double>(static_cast<float>(d[i])));
    // BF16 / F16: each value within half a unit in the last place of the stored precision.
    const auto b = st.read<double>("model.bf16");
    const auto h = st.read<float>("model.f16");
    for (std::size_t i = 0; i < d.size(); ++i) {
      CHECK(std::fabs(b[i] - d[i]) <= std::ldexp(std::fabs(d[i]), -8));
      if (i < 3) continue;
      CHECK(std::fabs(static_cast<double>(h[i]) - static_cast<double>(f[i])) <=
            std::ldexp(std::fabs(static_cast<double>(f[i])), -11));
    }
    CHECK(std::isinf(h[0]));
    CHECK(std::signbit(h[1]));
    CHECK(h[2] == 0.0f);  // 1e-30 underflows in F16
    CHECK(st.read_ints("ids") == ids);
    CHECK(st.read_ints("ids32") == std::vector<std::int64_t>(ids32.begin(), ids32.end()));
    CHECK(st.read_ints("ids_as_i32") == std::vector<std::int64_t>{0, 1});
    CHECK(st.read<float>("empty").empty());
  }
}

TEST_CASE("writer refuses bad tensors with a message naming them") {
  safetensors_writer w;
  const std::vector<double> two = {1.0, 2.0};
  const std::vector<std::int64_t> big = {std::int64_t{1} << 40};
  w.add("a", {2}, std::span<const double>(two));
  CHECK(contains(error_of([&] { w.add("a", {2}, std::span<const double>(two)); }),
                 "duplicate tensor name 'a'"));
  CHECK(contains(error_of([&] { w.add("b", {3}, std::span<const double>(two)); }),
                 "tensor 'b' shape [3] holds 3 elements, the data has 2"));
  CHECK(contains(error_of([&] { w.add("c", {-2}, std::span<const double>(two)); }), "extent -2"));
  CHECK(contains(error_of([&] { w.add("d", {2}, std::span<const double>(two), dtype::i64); }),
                 "floating data cannot be stored as I64"));
  CHECK(contains(error_of([&] { w.add("e", {1}, std::span<const std::int64_t>(big), dtype::f32); }),
                 "integer data cannot be stored as F32"));
  CHECK(contains(error_of([&] { w.add("f", {1}, std::span<const std::int64_t>(big), dtype::i32); }),
                 "does not fit I32"));
  CHECK(contains(error_of([&] { w.add("__metadata__", {2}, std::span<const double>(two)); }),
                 "reserved"));
  CHECK(contains(error_of([&] { w.add("", {2}, std::span<const double>(two)); }), "empty"));
  CHECK(contains(error_of([&] { w.add("bad\xff", {2}, std::span<const double>(two)); }),
                 "not valid UTF-8"));
  CHECK(w.size() == 1);
  tightfit::testing::scratch_dir dir;
  CHECK(contains(error_of([&] { w.write(dir / "missing_dir" / "x.safetensors"); }),
                 "cannot open for writing"));
}

TEST_CASE("reader decodes a hand-built file (independent of the writer)") {
  // F16 1.0 = 0x3C00, -2.0 = 0xC000, smallest subnormal 0x0001, -inf 0xFC00;
  // BF16 1.0 = 0x3F80, 0x7FC0 = NaN; I32 -100; U8 255; BOOL 0/2(true).
  const std::string data = le_bytes(0x3C00, 2) + le_bytes(0xC000, 2) + le_bytes(0x0001, 2) +
                           le_bytes(0xFC00, 2) + le_bytes(0x3F80, 2) + le_bytes(0x7FC0, 2) +
                           le_bytes(static_cast<std::uint32_t>(-100), 4) + le_bytes(255, 1) +
                           le_bytes(0, 1) + le_bytes(2, 1);
  const std::string header = R"({"h":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
                             R"("i":{"dtype":"I32","shape":[1],"data_offsets":[12,16]},)"
                             R"("u":{"dtype":"U8","shape":[1],"data_offsets":[16,17]},)"
                             R"("m":{"dtype":"BOOL","shape":[2],"data_offsets":[17,19]},)"
                             R"("__metadata__":{"note":"hand made"}})";
  const std::string image = hand_image(header, data);
  const auto st = safetensors_view::parse(as_bytes(image), "hand");
  CHECK(st.names() == std::vector<std::string>{"h", "b", "i", "u", "m"});  // offset order
  CHECK(st.metadata().at("note") == "hand made");
  const auto h = st.read<double>("h");
  CHECK(h[0] == 1.0);
  CHECK(h[1] == -2.0);
  CHECK(h[2] == std::ldexp(1.0, -24));
  CHECK(h[3] == -std::numeric_limits<double>::infinity());
  const auto b = st.read<float>("b");
  CHECK(b[0] == 1.0f);
  CHECK(std::isnan(b[1]));
  CHECK(st.read_ints("i") == std::vector<std::int64_t>{-100});
  CHECK(st.read_ints("u") == std::vector<std::int64_t>{255});
  CHECK(st.read_ints("m") == std::vector<std::int64_t>{0, 1});
  CHECK(st.bytes("u").size() == 1);

  // Accessor refusals.
  std::vector<double> three(3);
  CHECK(contains(error_of([&] { st.read<double>("h", std::span<double>(three)); }),
                 "tensor 'h' has 4 elements (shape [2, 2]), the destination holds 3"));
  CHECK(contains(error_of([&] { (void)st.read<double>("i"); }),
                 "tensor 'i' has dtype I32, which cannot be read as floating point"));
  CHECK(contains(error_of([&] { (void)st.read_ints("h"); }),
                 "tensor 'h' has dtype F16, which cannot be read as integers"));
  CHECK(contains(error_of([&] { (void)st.info("nope"); }), "hand: no tensor named 'nope'"));
}

TEST_CASE("every file of the malformed corpus gives its error; the valid ones parse") {
  const std::filesystem::path dir = TIGHTFIT_IO_CORPUS_DIR;
  std::ifstream list(dir / "expected.tsv");
  REQUIRE(list);
  std::string line;
  int malformed = 0;
  while (std::getline(list, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto tab = line.find('\t');
    REQUIRE(tab != std::string::npos);
    const std::string file = line.substr(0, tab), expected = line.substr(tab + 1);
    CAPTURE(file);
    const std::string message = error_of([&] { (void)safetensors_file::open(dir / file); });
    CAPTURE(message);
    CHECK(contains(message, expected));
    CHECK(contains(message, file));  // the message names the file
    ++malformed;
  }
  CHECK(malformed >= 25);
  int valid = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("valid_", 0) != 0) continue;
    CAPTURE(name);
    CHECK_NOTHROW((void)safetensors_file::open(entry.path()));
    ++valid;
  }
  CHECK(valid >= 3);
  const auto mixed = safetensors_file::open(dir / "valid_mixed.safetensors");
  CHECK(mixed.read_ints("ids") == std::vector<std::int64_t>{5, -100, 7});
  CHECK(mixed.read<double>("h")[1] == -std::ldexp(1.0, -24));
  CHECK(std::isinf(mixed.read<float>("b")[1]));
}

TEST_CASE("messages name the tensor and the problem; nothing is read out of bounds") {
  const std::string data(16, '\0');
  auto parse = [&](const std::string& header) {
    return error_of(
        [&] { (void)safetensors_view::parse(as_bytes(hand_image(header, data)), "f"); });
  };
  CHECK(parse(R"({"w":{"dtype":"F32","shape":[5],"data_offsets":[0,20]}})") ==
        "f: tensor 'w': data_offsets [0, 20] run past the end of the data area (16 bytes)");
  CHECK(parse(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})") ==
        "f: tensor 'w': data_offsets [0, 12] hold 12 bytes, expected 8 (shape [2] x F32)");
  CHECK(contains(parse(R"({"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F16","shape":[2],"data_offsets":[6,10]}})"),
                 "tensor 'b': data_offsets [6, 10] overlap those of tensor 'a' [0, 8]"));
  // Empty tensors may sit anywhere; adjacent ranges do not overlap.
  CHECK(parse(R"({"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},)"
              R"("z":{"dtype":"F16","shape":[0],"data_offsets":[4,4]},)"
              R"("b":{"dtype":"F16","shape":[4],"data_offsets":[8,16]}})") == "<no error>");
  CHECK(contains(parse(R"({"w":{"dtype":"F32","shape":{},"data_offsets":[0,0]}})"),
                 "nests objects too deeply"));
  CHECK(contains(parse(R"({"w":{"dtype":"F32","shape":3,"data_offsets":[0,0]}})"),
                 "shape is 3, expected an array"));
  CHECK(contains(parse(R"({"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"), "empty name"));
  CHECK(contains(parse(R"({"__metadata__":[1]})"), "__metadata__ is a JSON array"));
  // The header length may not reach into the 8 length bytes or past the end.
  std::string image = hand_image("{}", "");
  image[0] = 9;
  CHECK(contains(error_of([&] { (void)safetensors_view::parse(as_bytes(image), "g"); }),
                 "g: header length 9 runs past the end of the file (8 bytes after the length)"));
  // Every prefix of a valid file is refused or parses to tensors that fit the prefix.
  safetensors_writer w;
  const auto v = tightfit::testing::uniform<double>(10, 3);
  w.add("a", {10}, std::span<const double>(v));
  w.add("b", {2, 5}, std::span<const double>(v), dtype::bf16);
  const auto full = w.serialize();
  int refused = 0;
  for (std::size_t n = 0; n < full.size(); ++n) {
    const std::span<const std::byte> prefix(full.data(), n);
    if (error_of([&] { (void)safetensors_view::parse(prefix, "prefix"); }) != "<no error>")
      ++refused;
  }
  CHECK(refused == static_cast<int>(full.size()));
}

TEST_CASE("safetensors_file: open errors name the path; the file is movable") {
  tightfit::testing::scratch_dir dir;
  CHECK(contains(error_of([&] { (void)safetensors_file::open(dir / "absent.safetensors"); }),
                 "absent.safetensors: cannot open"));
  CHECK(contains(error_of([&] { (void)safetensors_file::open(dir.path()); }),
                 "is a directory, expected a regular file"));
  safetensors_writer w;
  const std::vector<float> v = {1.5f, 2.5f};
  w.add("v", {2}, std::span<const float>(v));
  w.write(dir / "v.safetensors");
  auto a = safetensors_file::open(dir / "v.safetensors");
  safetensors_file b = std::move(a);
  safetensors_file c;
  c = std::move(b);
  CHECK(c.read<float>("v") == v);
  CHECK(c.source() == (dir / "v.safetensors").string());
}

TEST_CASE("safetensors_file: a file truncated after it was opened gives an error naming it") {
  // read by position, not mapped: the lost bytes are a short read, not SIGBUS (issue 35)
  tightfit::testing::scratch_dir dir;
  const std::vector<double> big(1 << 18, 0.25);  // 2 MiB: several 1 MiB blocks when converted
  safetensors_writer w;
  w.add("a", {static_cast<index_t>(big.size())}, std::span<const double>(big));
  w.add("i", {4}, std::span<const std::int64_t>(std::vector<std::int64_t>{1, 2, 3, 4}));
  const auto path = dir / "shrinks.safetensors";
  for (std::uintmax_t keep : {std::uintmax_t{0}, std::uintmax_t{100}, std::uintmax_t{1} << 20}) {
    CAPTURE(keep);
    w.write(path);
    const auto f = safetensors_file::open(path);
    CHECK(f.read<double>("a") == big);
    std::filesystem::resize_file(path, keep);
    for (auto read : {+[](const safetensors_file& g) { (void)g.read<double>("a"); },
                      +[](const safetensors_file& g) { (void)g.read<float>("a"); },
                      +[](const safetensors_file& g) { (void)g.read_ints("i"); },
                      +[](const safetensors_file& g) { (void)g.read_raw("a"); }}) {
      const std::string e = error_of([&] { read(f); });
      CHECK(contains(e, path.string() + ": the file ends at byte"));
      CHECK(contains(e, "truncated while it was read"));
    }
  }
  // a FIFO is refused when opened, without waiting for a writer
#if defined(__unix__)
  const auto fifo = dir / "fifo.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(contains(error_of([&] { (void)safetensors_file::open(fifo); }),
                 "is a FIFO, expected a regular file"));
#endif
}

#if defined(TIGHTFIT_IO_PYTHON) && (defined(__unix__) || defined(__APPLE__))
namespace {
/// Runs a command and returns its stdout; the exit status goes to `status`.
std::string run_command(const std::string& command, int& status) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  status = ::pclose(pipe);
  return out;
}

double json_double(const nlohmann::json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    return s[0] == '-' ? -std::numeric_limits<double>::infinity()
                       : std::numeric_limits<double>::infinity();
  }
  return v.get<double>();
}
}  // namespace

TEST_CASE("cross-check with an independent Python implementation (json + struct)") {
  tightfit::testing::scratch_dir dir;
  const std::string script = std::string(TIGHTFIT_IO_PYTHON) + " " + TIGHTFIT_IO_XCHECK_SCRIPT;
  int status = 0;

  SUBCASE("files written by Python decode to the values Python computed") {
    const auto file = dir / "py.safetensors";
    const auto expected =
        nlohmann::json::parse(run_command(script + " write " + file.string(), status));
    REQUIRE(status == 0);
    const auto st = safetensors_file::open(file);
    CHECK(st.size() == expected.size());
    for (const auto& [name, t] : expected.items()) {
      CAPTURE(name);
      CHECK(dtype_name(st.info(name).type) == t["dtype"].get<std::string>());
      CHECK(st.info(name).shape == t["shape"].get<std::vector<index_t>>());
      const auto& values = t["values"];
      if (is_floating(st.info(name).type)) {
        const auto got = st.read<double>(name);
        REQUIRE(got.size() == values.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
          const double want = json_double(values[i]);
          CHECK((got[i] == want || (std::isnan(got[i]) && std::isnan(want))));
          CHECK(std::signbit(got[i]) == std::signbit(want));
        }
      } else {
        const auto got = st.read_ints(name);
        REQUIRE(got.size() == values.size());
        for (std::size_t i = 0; i < got.size(); ++i)
          CHECK(got[i] == (values[i].is_boolean() ? (values[i].get<bool>() ? 1 : 0)
                                                  : values[i].get<std::int64_t>()));
      }
    }
  }

  SUBCASE("files written by tightfit pass Python's strict check with the same values") {
    const auto d = tightfit::testing::uniform<double>(12, 5, -70000.0, 70000.0);
    const std::vector<std::int64_t> ids = {3, -100, 1 << 30};
    safetensors_writer w;
    w.add("x.f64", {3, 4}, std::span<const double>(d));
    w.add("x.f32", {12}, std::span<const double>(d), dtype::f32);
    w.add("x.f16", {12}, std::span<const double>(d), dtype::f16);  // some overflow to inf
    w.add("x.bf16", {4, 3}, std::span<const double>(d), dtype::bf16);
    w.add("ids", {3}, std::span<const std::int64_t>(ids), dtype::i32);
    w.set_metadata("format", "pt");
    const auto file = dir / "ours.safetensors";
    w.write(file);
    const auto seen =
        nlohmann::json::parse(run_command(script + " check " + file.string(), status));
    REQUIRE(status == 0);
    const auto st = safetensors_file::open(file);
    CHECK(seen.size() == st.size());
    for (const auto& t : st.tensors()) {
      CAPTURE(t.name);
      const auto& values = seen.at(t.name)["values"];
      if (is_floating(t.type)) {
        const auto ours = st.read<double>(t.name);
        for (std::size_t i = 0; i < ours.size(); ++i) CHECK(json_double(values[i]) == ours[i]);
      } else {
        CHECK(values.get<std::vector<std::int64_t>>() == st.read_ints(t.name));
      }
    }
  }
}
#endif
