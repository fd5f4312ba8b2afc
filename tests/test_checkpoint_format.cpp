// Unit tests for the checkpoint file format (include/mirrored/checkpoint.hpp): round trips of
// every dtype, the exact byte layout of a tiny file, every kind of corrupt or truncated file,
// name/dtype/shape errors, crash safety of the save (fault injection, a forked child killed half
// way), and interoperability with Python's `safetensors` package when it is installed.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gtest_util.hpp"
#include "mirrored/checkpoint.hpp"
#include "mirrored/device.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored {
namespace {

namespace fs = std::filesystem;
using checkpoint::untyped;
using ::testing::AllOf;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

/// A safetensors file: 8-byte little-endian length, `header` (not padded), `data`.
std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

template <class T>
std::string raw_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <class T>
std::string raw_bytes(const Tensor<T>& t) {
  return raw_bytes(t.to_vector());
}

/// Runs `fn` and returns the message of the `E` it throws (fails the test when it throws nothing
/// or something else).
using mirrored::testing::error_of;

class CheckpointFormat : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "mirrored_ckpt_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    detail::set_checkpoint_fault_hook(nullptr);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }

  /// A small checkpoint with two tensors, returning its path.
  std::string small_checkpoint() {
    const std::string p = file("small.safetensors");
    checkpoint::save_tensors(p, {{"a", untyped(Tensor<float>{1.0f, 2.0f})},
                                 {"b", untyped(Tensor<int32_t>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}))}});
    return p;
  }

  std::string dir_;
};

// ---------------------------------------------------------------------------------------------
// CRC-32
// ---------------------------------------------------------------------------------------------

TEST(CheckpointCrc32, MatchesZlibCheckValues) {
  // The standard CRC-32 check value, and values zlib.crc32 gives.
  EXPECT_EQ(detail::checkpoint_crc32(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(detail::checkpoint_crc32(0, "", 0), 0u);
  const unsigned char tiny[] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40, 0x07};
  EXPECT_EQ(detail::checkpoint_crc32(0, tiny, sizeof tiny), 0xF52E9182u);
  // Incremental use gives the same result as one call.
  const std::uint32_t part = detail::checkpoint_crc32(0, "1234", 4);
  EXPECT_EQ(detail::checkpoint_crc32(part, "56789", 5), 0xCBF43926u);
}

// ---------------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------------

TEST_F(CheckpointFormat, RoundTripsEveryDtypeBitExactly) {
  const float fnan = std::bit_cast<float>(std::uint32_t{0x7FC01234});  // NaN with a payload
  const double dnan = std::bit_cast<double>(std::uint64_t{0xFFF8000000ABCDEFull});
  const auto f32 = Tensor<float>::from_vector(
      {0.5f, -1.25f, 3.0f, -0.0f, std::numeric_limits<float>::infinity(), fnan,
       std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(), 1e-7f, -3.5e12f, 0.1f, 7.0f},
      {2, 3, 2});
  const auto f64 = Tensor<double>::from_vector(
      {0.1, -0.0, dnan, std::numeric_limits<double>::lowest(), std::numeric_limits<double>::denorm_min(), 1e300},
      {3, 2});
  const auto i32 = Tensor<int32_t>::from_vector(
      {std::numeric_limits<int32_t>::min(), -1, 0, 1, std::numeric_limits<int32_t>::max()}, {5});
  const auto i64 = Tensor<int64_t>::from_vector(
      {std::numeric_limits<int64_t>::min(), -1, 4000000000LL, std::numeric_limits<int64_t>::max()}, {2, 2});
  std::vector<uint8_t> all_bytes(256);
  for (int i = 0; i < 256; ++i) all_bytes[i] = static_cast<uint8_t>(i);
  const auto u8 = Tensor<uint8_t>::from_vector(all_bytes, {16, 16});
  const auto scalar = Tensor<double>::scalar(-2.75);
  const auto empty = Tensor<float>::zeros({0});
  const auto empty2 = Tensor<int64_t>::zeros({2, 0, 3});
  const Device cpu1(DeviceType::CPU, 1);
  const auto on_cpu1 = Tensor<float>::from_vector({9.0f, 8.0f}, {2}, cpu1);

  const std::string p = file("all.safetensors");
  const checkpoint::Metadata meta{{"step", "1200"},
                                  {"note", "quotes \" backslash \\ newline \n tab \t ctrl \x01 unicode \xc3\xa9\xe2\x82\xac"}};
  checkpoint::save_tensors(p,
                           {{"dense/kernel", untyped(f32)},
                            {"f64", untyped(f64)},
                            {"i32", untyped(i32)},
                            {"i64", untyped(i64)},
                            {"u8", untyped(u8)},
                            {"scalar", untyped(scalar)},
                            {"empty", untyped(empty)},
                            {"empty2", untyped(empty2)},
                            {"on_cpu1", untyped(on_cpu1)},
                            {"name with \"quotes\" and \xc3\xa9", untyped(Tensor<uint8_t>{42})}},
                           meta);
  EXPECT_FALSE(fs::exists(detail::checkpoint_temp_path(p)));

  const checkpoint::Checkpoint ck = checkpoint::load(p);
  EXPECT_EQ(ck.path(), p);
  EXPECT_EQ(ck.tensors().size(), 10u);
  EXPECT_EQ(ck.names().front(), "dense/kernel");

  const auto g32 = ck.get<float>("dense/kernel", {2, 3, 2});
  EXPECT_EQ(g32.device(), cpu0);
  EXPECT_EQ(raw_bytes(g32), raw_bytes(f32));  // bit-exact: NaN payload, -0.0, denormals
  EXPECT_EQ(raw_bytes(ck.get<double>("f64", {3, 2})), raw_bytes(f64));
  EXPECT_EQ(ck.get<int32_t>("i32", {5}).to_vector(), i32.to_vector());
  EXPECT_EQ(ck.get<int64_t>("i64", {2, 2}).to_vector(), i64.to_vector());
  EXPECT_EQ(ck.get<uint8_t>("u8", {16, 16}).to_vector(), all_bytes);
  const auto s = ck.get<double>("scalar", {});
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.item(), -2.75);
  EXPECT_EQ(ck.get<float>("empty").shape(), Shape({0}));
  EXPECT_EQ(ck.get<int64_t>("empty2").shape(), Shape({2, 0, 3}));
  const auto c1 = ck.get<float>("on_cpu1");
  EXPECT_EQ(c1.device(), cpu0);  // loads land on the host
  EXPECT_EQ(c1.to_vector(), (std::vector<float>{9.0f, 8.0f}));
  EXPECT_EQ(ck.get<uint8_t>("name with \"quotes\" and \xc3\xa9").item(), 42);

  EXPECT_EQ(ck.metadata().at("step"), "1200");
  EXPECT_EQ(ck.metadata().at("note"), meta.at("note"));
  EXPECT_EQ(ck.metadata().at("mirrored.format"), "1");
  EXPECT_THAT(ck.metadata().at("mirrored.checksum"), ::testing::MatchesRegex("crc32:[0-9a-f]{8}"));

  // load_tensors is the same data without the wrapper.
  const checkpoint::TensorMap m = checkpoint::load_tensors(p);
  EXPECT_EQ(m.size(), 10u);
  EXPECT_EQ(m.at("i32").dtype, DType::int32);
}

TEST_F(CheckpointFormat, SavingAgainReplacesTheFile) {
  const std::string p = file("x.safetensors");
  checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{1.0f})}});
  checkpoint::save_tensors(p, {{"v", untyped(Tensor<int64_t>{5, 6})}});
  const auto ck = checkpoint::load(p);
  EXPECT_FALSE(ck.contains("w"));
  EXPECT_EQ(ck.get<int64_t>("v").to_vector(), (std::vector<int64_t>{5, 6}));
  EXPECT_FALSE(fs::exists(detail::checkpoint_temp_path(p)));
}

TEST_F(CheckpointFormat, EmptyCheckpointRoundTrips) {
  const std::string p = file("empty.safetensors");
  checkpoint::save_tensors(p, {});
  const auto ck = checkpoint::load(p);
  EXPECT_TRUE(ck.tensors().empty());
  EXPECT_THAT(error_of<NotFoundError>([&] { ck.at("w"); }), HasSubstr("the file has no tensors"));
}

TEST_F(CheckpointFormat, RoundTripsTensorsLargerThanOneWriteChunk) {
  const std::size_t n = detail::kCheckpointChunkBytes / sizeof(float) * 2 + 123;  // 2 chunks + a bit
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.5f;
  const std::string p = file("big.safetensors");
  checkpoint::save_tensors(p, {{"big", untyped(Tensor<float>::from_vector(v, {static_cast<int64_t>(n)}))},
                               {"small", untyped(Tensor<uint8_t>{1, 2, 3})}});
  const auto ck = checkpoint::load(p);
  EXPECT_EQ(ck.get<float>("big").to_vector(), v);
  EXPECT_EQ(ck.get<uint8_t>("small").to_vector(), (std::vector<uint8_t>{1, 2, 3}));
}

// ---------------------------------------------------------------------------------------------
// Exact byte layout
// ---------------------------------------------------------------------------------------------

TEST_F(CheckpointFormat, TinyFileHasTheExactSafetensorsByteLayout) {
  const std::string p = file("tiny.safetensors");
  checkpoint::save_tensors(p, {{"b", untyped(Tensor<uint8_t>::scalar(7))}, {"a", untyped(Tensor<float>{1.0f, 2.0f})}});
  const std::string bytes = read_file(p);

  // Header JSON: __metadata__ first, then tensors in name order; offsets relative to the data.
  // crc32(00 00 80 3f 00 00 00 40 07) = f52e9182 (Python: zlib.crc32).
  const std::string json =
      R"({"__metadata__":{"mirrored.checksum":"crc32:f52e9182","mirrored.format":"1"},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[],"data_offsets":[8,9]}})";
  ASSERT_EQ(json.size(), 181u);
  const std::string header = json + "   ";  // padded with spaces to 184, a multiple of 8

  // 8-byte little-endian header length: 184 = 0xb8.
  const std::string length("\xb8\x00\x00\x00\x00\x00\x00\x00", 8);
  // Data: 1.0f = 00 00 80 3f, 2.0f = 00 00 00 40 (little-endian), then the byte 7.
  const std::string data("\x00\x00\x80\x3f\x00\x00\x00\x40\x07", 9);

  ASSERT_EQ(bytes.size(), 8u + 184u + 9u);
  EXPECT_EQ(bytes.substr(0, 8), length);
  EXPECT_EQ(bytes.substr(8, 184), header);
  EXPECT_EQ(bytes.substr(192), data);
  EXPECT_EQ(bytes, length + header + data);
}

TEST_F(CheckpointFormat, HandWrittenFileLoads) {
  // Key order, whitespace and escapes as another writer might produce them; no checksum.
  const std::string header =
      "{ \"b\" : {\"shape\": [ 1 ], \"data_offsets\": [4, 12], \"dtype\": \"F64\"},\n"
      "  \"\\u0061\\n\\ud83d\\ude00\": {\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]},\n"
      "  \"__metadata__\": {\"format\": \"pt\"} }";
  std::string data;
  const int32_t i = -7;
  const double d = 0.25;
  data += std::string(reinterpret_cast<const char*>(&i), 4);
  data += std::string(reinterpret_cast<const char*>(&d), 8);
  const std::string p = file("hand.safetensors");
  write_file(p, make_file(header, data));

  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
              AllOf(HasSubstr(p), HasSubstr("no 'mirrored.checksum'")));
  const auto ck = checkpoint::load(p, {.require_checksum = false});
  EXPECT_EQ(ck.get<double>("b", {1}).item(), 0.25);
  EXPECT_EQ(ck.get<int32_t>("a\n\xf0\x9f\x98\x80", {}).item(), -7);
  EXPECT_EQ(ck.metadata().at("format"), "pt");
}

// ---------------------------------------------------------------------------------------------
// Corrupt and truncated files
// ---------------------------------------------------------------------------------------------

TEST_F(CheckpointFormat, MissingFileIsNotFound) {
  const std::string p = file("nope.safetensors");
  EXPECT_THAT(error_of<NotFoundError>([&] { checkpoint::load(p); }), AllOf(HasSubstr(p), HasSubstr("no such file")));
}

TEST_F(CheckpointFormat, TruncatedFilesAreRejectedAtEveryLength) {
  const std::string good = small_checkpoint();
  const std::string bytes = read_file(good);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[i]);
  const std::string p = file("cut.safetensors");
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    write_file(p, bytes.substr(0, n));
    const std::string msg = error_of<InvalidArgumentError>([&] { checkpoint::load(p); });
    EXPECT_THAT(msg, HasSubstr(p)) << "cut at " << n;
    if (n < 8 + header_len) {
      EXPECT_THAT(msg, HasSubstr("truncated")) << "cut at " << n;
    } else {
      // Inside the data: the message names the tensor whose bytes are missing.
      EXPECT_THAT(msg, AllOf(HasSubstr("truncated: tensor"), HasSubstr(n < 8 + header_len + 8 ? "'a'" : "'b'")))
          << "cut at " << n;
    }
  }
  // Appended garbage is also an error (the header no longer describes the file).
  write_file(p, bytes + "xyz");
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }), HasSubstr("3 bytes after the last tensor"));
}

TEST_F(CheckpointFormat, FlippedDataByteFailsTheChecksum) {
  const std::string good = small_checkpoint();
  const std::string bytes = read_file(good);
  for (std::size_t back : {1u, 9u, 32u}) {  // last byte of 'b', inside 'b', inside 'a'
    std::string bad = bytes;
    bad[bad.size() - back] ^= 0x10;
    const std::string p = file("flip.safetensors");
    write_file(p, bad);
    EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
                AllOf(HasSubstr(p), HasSubstr("checksum mismatch")));
  }
}

TEST_F(CheckpointFormat, CorruptHeaderJsonIsRejected) {
  const std::string good = small_checkpoint();
  const std::string bytes = read_file(good);
  const std::string p = file("bad.safetensors");

  // Damage the header in place (same length, so only the JSON is wrong).
  auto damaged = [&](const std::string& from, const std::string& to) {
    std::string b = bytes;
    const auto at = b.find(from, 8);
    EXPECT_NE(at, std::string::npos) << from;
    b.replace(at, from.size(), to);
    return b;
  };
  write_file(p, damaged("{\"__metadata__\"", "[\"__metadata__\""));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
              AllOf(HasSubstr(p), HasSubstr("corrupt header"), HasSubstr("to start with '{'")));
  write_file(p, damaged("\"dtype\":\"F32\"", "\"dtype\":\"F32 "));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }), HasSubstr("corrupt header"));
  write_file(p, damaged("\"shape\":[2]", "\"shape\":[x]"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
              AllOf(HasSubstr("corrupt header"), HasSubstr("non-negative integer")));
  write_file(p, damaged("\"dtype\":\"F32\"", "\"dtype\":\"F16\""));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
              AllOf(HasSubstr("tensor 'a'"), HasSubstr("unsupported dtype 'F16'")));
  write_file(p, damaged("\"shape\":[2]", "\"shape\":[3]"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
              AllOf(HasSubstr("tensor 'a'"), HasSubstr("span 8 bytes, but F32 shape (3,) needs 12")));
  write_file(p, damaged("\"shape\":[2]", "\"shapf\":[2]"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
              AllOf(HasSubstr("tensor 'a'"), HasSubstr("unexpected key 'shapf'")));
  write_file(p, damaged("crc32:", "crc33:"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }), HasSubstr("expected 'crc32:'"));
  write_file(p, damaged("\"mirrored.format\":\"1\"", "\"mirrored.format\":\"9\""));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }), HasSubstr("unsupported mirrored.format '9'"));

  // A header length pointing past the end of the file, and one over the safetensors limit.
  std::string b = bytes;
  b[0] = '\xff';
  b[1] = '\xff';
  write_file(p, b);
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }), HasSubstr("truncated: header length"));
  b[5] = '\x01';
  write_file(p, b);
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }), HasSubstr("exceeds the safetensors limit"));
}

TEST_F(CheckpointFormat, InconsistentOffsetsNameTheTensor) {
  const std::string p = file("offsets.safetensors");
  const std::string data(16, '\0');
  auto load_msg = [&](const std::string& header) {
    write_file(p, make_file(header, data));
    return error_of<InvalidArgumentError>([&] { checkpoint::load(p, {.require_checksum = false}); });
  };
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                       R"("y":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})"),
              AllOf(HasSubstr("tensor 'y'"), HasSubstr("overlap")));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                       R"("y":{"dtype":"I32","shape":[1],"data_offsets":[12,16]}})"),
              AllOf(HasSubstr("tensor 'y'"), HasSubstr("gap")));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[2],"data_offsets":[8,0]}})"),
              AllOf(HasSubstr("tensor 'x'"), HasSubstr("reversed")));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[2]}})"),
              AllOf(HasSubstr("tensor 'x'"), HasSubstr("missing \"data_offsets\"")));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[4],"data_offsets":[0,16]},)"
                       R"("x":{"dtype":"I32","shape":[0],"data_offsets":[16,16]}})"),
              HasSubstr("duplicate tensor name 'x'"));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[4],"data_offsets":[0,16]}} junk)"),
              HasSubstr("unexpected data after the header object"));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[4],"data_offsets":[0,16]},"__metadata__":{"k":1}})"),
              HasSubstr("value of 'k' is not a string"));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[99999999999999999999],"data_offsets":[0,16]}})"),
              HasSubstr("too large"));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[-4],"data_offsets":[0,16]}})"),
              HasSubstr("non-negative integer"));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[4],"data_offsets":[0,16]})"),
              HasSubstr("found the end of the header"));
}

// ---------------------------------------------------------------------------------------------
// Names, dtypes and shapes
// ---------------------------------------------------------------------------------------------

TEST_F(CheckpointFormat, MissingNameDtypeAndShapeMismatchNameFileAndTensor) {
  const auto ck = checkpoint::load(small_checkpoint());
  const std::string& p = ck.path();
  EXPECT_THAT(error_of<NotFoundError>([&] { ck.get<float>("dense/bias"); }),
              AllOf(HasSubstr(p), HasSubstr("no tensor named 'dense/bias'"), HasSubstr("the file has 'a', 'b'")));
  EXPECT_THAT(error_of<NotFoundError>([&] { ck.check("c", DType::float32, {2}); }), HasSubstr("'c'"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { ck.get<double>("a"); }),
              AllOf(HasSubstr(p), HasSubstr("tensor 'a': dtype mismatch: the file has float32, expected float64")));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { ck.get<int32_t>("b", {3, 2}); }),
              AllOf(HasSubstr(p), HasSubstr("tensor 'b': shape mismatch: the file has (2, 3), expected (3, 2)")));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { ck.check("a", DType::float32, {}); }),
              HasSubstr("shape mismatch: the file has (2,), expected ()"));
  EXPECT_NO_THROW(ck.check("b", DType::int32, {2, 3}));
}

TEST_F(CheckpointFormat, SaveRejectsReservedNamesAndMissingDirectories) {
  const std::string p = file("r.safetensors");
  const auto t = untyped(Tensor<float>{1.0f});
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::save_tensors(p, {{"__metadata__", t}}); }),
              HasSubstr("'__metadata__' cannot be a tensor name"));
  EXPECT_THAT(error_of<InvalidArgumentError>(
                  [&] { checkpoint::save_tensors(p, {{"w", t}}, {{"mirrored.checksum", "x"}}); }),
              HasSubstr("reserved"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::save_tensors(p, {{"bad\xff", t}}); }),
              HasSubstr("not valid UTF-8"));
  EXPECT_FALSE(fs::exists(p));
  const std::string nodir = file("missing/dir/x.safetensors");
  EXPECT_THAT(error_of<NotFoundError>([&] { checkpoint::save_tensors(nodir, {{"w", t}}); }), HasSubstr(nodir));
}

// ---------------------------------------------------------------------------------------------
// Crash safety
// ---------------------------------------------------------------------------------------------

/// A checkpoint of 3 write chunks of data, so "half way" falls between chunks.
checkpoint::TensorMap three_chunk_tensors(float value) {
  const auto n = static_cast<int64_t>(detail::kCheckpointChunkBytes / sizeof(float) * 3);
  return {{"big", untyped(Tensor<float>::full({n}, value))}, {"step", untyped(Tensor<int64_t>::scalar(7))}};
}

void throw_half_way(const std::string&, std::uint64_t written, std::uint64_t total) {
  if (written * 2 >= total) throw std::runtime_error("injected fault half way");
}

void exit_half_way(const std::string&, std::uint64_t written, std::uint64_t total) {
  if (written * 2 >= total) ::_exit(42);
}

std::vector<std::uint64_t> g_hook_calls;
void record_calls(const std::string&, std::uint64_t written, std::uint64_t total) {
  g_hook_calls.push_back(written);
  g_hook_calls.push_back(total);
}

TEST_F(CheckpointFormat, FaultHookSeesEveryChunk) {
  const std::string p = file("hooked.safetensors");
  g_hook_calls.clear();
  detail::set_checkpoint_fault_hook(record_calls);
  checkpoint::save_tensors(p, three_chunk_tensors(1.0f));
  detail::set_checkpoint_fault_hook(nullptr);
  const auto size = static_cast<std::uint64_t>(fs::file_size(p));
  // After the header, after each of the 3 chunks of 'big', after 'step'.
  ASSERT_EQ(g_hook_calls.size(), 2u * 5u);
  for (std::size_t i = 1; i < g_hook_calls.size(); i += 2) EXPECT_EQ(g_hook_calls[i], size);
  EXPECT_EQ(g_hook_calls[8], size);
  EXPECT_EQ(g_hook_calls[6] + 8, size);
  EXPECT_EQ(g_hook_calls[4] + detail::kCheckpointChunkBytes, g_hook_calls[6]);
}

TEST_F(CheckpointFormat, ExceptionHalfWayKeepsTheOldCheckpointAndLeavesNoTempFile) {
  const std::string p = file("model.safetensors");
  checkpoint::save_tensors(p, three_chunk_tensors(1.5f));
  const std::string before = read_file(p);

  detail::set_checkpoint_fault_hook(throw_half_way);
  EXPECT_THROW(checkpoint::save_tensors(p, three_chunk_tensors(2.5f)), std::runtime_error);
  detail::set_checkpoint_fault_hook(nullptr);

  EXPECT_EQ(read_file(p), before);
  EXPECT_FALSE(fs::exists(detail::checkpoint_temp_path(p)));
  EXPECT_EQ(checkpoint::load(p).get<float>("big").to_vector()[12345], 1.5f);
}

TEST_F(CheckpointFormat, CrashHalfWayKeepsTheOldCheckpointAndTheNextSaveWorks) {
  const std::string p = file("model.safetensors");
  const std::string temp = detail::checkpoint_temp_path(p);
  checkpoint::save_tensors(p, three_chunk_tensors(1.5f));
  const std::string before = read_file(p);

  // A child process starts saving new values and dies (as by a crash or kill -9) half way.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    detail::set_checkpoint_fault_hook(exit_half_way);
    try {
      checkpoint::save_tensors(p, three_chunk_tensors(2.5f));
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(1);  // the hook did not fire
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 42) << "the child did not die half way through the save";

  // The previous checkpoint is untouched, byte for byte, and loads.
  EXPECT_EQ(read_file(p), before);
  const auto old = checkpoint::load(p);
  EXPECT_EQ(old.get<float>("big").to_vector().back(), 1.5f);
  EXPECT_EQ(old.get<int64_t>("step").item(), 7);
  // The dead save's partial temporary file is there (it never got renamed) ...
  ASSERT_TRUE(fs::exists(temp));
  EXPECT_LT(fs::file_size(temp), before.size());
  EXPECT_GT(fs::file_size(temp), before.size() / 2);

  // ... and does not get in the way of the next save, which reuses and renames it.
  checkpoint::save_tensors(p, three_chunk_tensors(3.5f));
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_EQ(checkpoint::load(p).get<float>("big").to_vector().front(), 3.5f);
}

TEST_F(CheckpointFormat, StaleGarbageTempFileIsOverwritten) {
  const std::string p = file("model.safetensors");
  write_file(detail::checkpoint_temp_path(p), std::string(10 << 20, 'x'));  // longer than the checkpoint
  checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{4.0f})}});
  EXPECT_FALSE(fs::exists(detail::checkpoint_temp_path(p)));
  EXPECT_EQ(checkpoint::load(p).get<float>("w").item(), 4.0f);
}

TEST_F(CheckpointFormat, ConcurrentSaveToTheSamePathIsRefused) {
  const std::string p = file("model.safetensors");
  checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{1.0f})}});
  const std::string before = read_file(p);
  // Someone else holds the save lock (an in-progress save in another process).
  const std::string temp = detail::checkpoint_temp_path(p);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // flock locks belong to the open file, so lock it from another process
    const int cfd = ::open(temp.c_str(), O_WRONLY);
    if (cfd < 0 || ::flock(cfd, LOCK_EX) != 0) ::_exit(1);
    ::sleep(30);
    ::_exit(0);
  }
  // Wait until the child holds the lock.
  bool locked = false;
  for (int i = 0; i < 500 && !locked; ++i) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      ::flock(fd, LOCK_UN);
      ::usleep(10000);
    } else {
      locked = true;
    }
  }
  ::close(fd);
  if (locked) {
    EXPECT_THAT(error_of<FailedPreconditionError>(
                    [&] { checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{2.0f})}}); }),
                AllOf(HasSubstr(p), HasSubstr("another save to this path is in progress")));
    EXPECT_EQ(read_file(p), before);
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(locked) << "the child never took the lock";
  // With the other saver gone, saving works again.
  checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{2.0f})}});
  EXPECT_EQ(checkpoint::load(p).get<float>("w").item(), 2.0f);
}

// ---------------------------------------------------------------------------------------------
// Python's safetensors package
// ---------------------------------------------------------------------------------------------

/// A Python interpreter that has `safetensors` and `numpy`, or "" when there is none.
std::string python_with_safetensors() {
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    const std::string cmd = std::string(py) + " -c 'import safetensors.numpy, numpy' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return py;
  }
  return "";
}

TEST_F(CheckpointFormat, PythonSafetensorsLoadsOurFiles) {
  const std::string py = python_with_safetensors();
  if (py.empty()) GTEST_SKIP() << "python3 with the safetensors and numpy packages is not installed";

  const std::string p = file("for_python.safetensors");
  checkpoint::save_tensors(
      p,
      {{"dense/kernel", untyped(Tensor<float>::from_vector({0.5f, -1.25f, 3.0f, 1e-3f, 2.0f, -0.0f}, {2, 3}))},
       {"f64", untyped(Tensor<double>::from_vector({0.1, -2.5, 1e300}, {3}))},
       {"i32", untyped(Tensor<int32_t>::from_vector({-2147483647 - 1, 0, 2147483647}, {3, 1}))},
       {"i64", untyped(Tensor<int64_t>::from_vector({-5, 4000000000LL}, {2}))},
       {"u8", untyped(Tensor<uint8_t>::from_vector({0, 7, 255}, {1, 3}))},
       {"scalar", untyped(Tensor<float>::scalar(6.5f))},
       {"empty", untyped(Tensor<float>::zeros({0, 4}))}},
      {{"step", "12"}});

  const std::string script = file("check.py");
  write_file(script, R"PY(
import sys, zlib
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

path = sys.argv[1]
got = load_file(path)
want = {
    "dense/kernel": np.array([[0.5, -1.25, 3.0], [1e-3, 2.0, -0.0]], dtype=np.float32),
    "f64": np.array([0.1, -2.5, 1e300], dtype=np.float64),
    "i32": np.array([[-2147483648], [0], [2147483647]], dtype=np.int32),
    "i64": np.array([-5, 4000000000], dtype=np.int64),
    "u8": np.array([[0, 7, 255]], dtype=np.uint8),
    "scalar": np.array(6.5, dtype=np.float32),
    "empty": np.zeros((0, 4), dtype=np.float32),
}
ok = sorted(got) == sorted(want)
if not ok:
    print("names:", sorted(got))
for k, w in want.items():
    g = got.get(k)
    if g is None or g.dtype != w.dtype or g.shape != w.shape or g.tobytes() != w.tobytes():
        print("mismatch", k, repr(g), repr(w))
        ok = False
with safe_open(path, framework="np") as f:
    meta = f.metadata()
if meta.get("step") != "12" or meta.get("mirrored.format") != "1":
    print("metadata", meta)
    ok = False
# The checksum is zlib's crc32 of the data section.
raw = open(path, "rb").read()
n = int.from_bytes(raw[:8], "little")
if meta.get("mirrored.checksum") != "crc32:%08x" % zlib.crc32(raw[8 + n:]):
    print("checksum", meta.get("mirrored.checksum"), "%08x" % zlib.crc32(raw[8 + n:]))
    ok = False
print("python safetensors: OK" if ok else "python safetensors: FAILED")
sys.exit(0 if ok else 1)
)PY");
  const std::string cmd = py + " " + script + " " + p + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST_F(CheckpointFormat, WeLoadFilesWrittenByPythonSafetensors) {
  const std::string py = python_with_safetensors();
  if (py.empty()) GTEST_SKIP() << "python3 with the safetensors and numpy packages is not installed";

  const std::string p = file("from_python.safetensors");
  const std::string script = file("write.py");
  write_file(script, R"PY(
import sys
import numpy as np
from safetensors.numpy import save_file
save_file({
    "w": np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5,
    "b": np.array([1, -2], dtype=np.int64),
    "u": np.array(200, dtype=np.uint8),
    "d": np.array([0.1], dtype=np.float64),
    "i": np.array([[7]], dtype=np.int32),
}, sys.argv[1], metadata={"origin": "python"})
)PY");
  const std::string cmd = py + " " + script + " " + p + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }), HasSubstr("no 'mirrored.checksum'"));
  const auto ck = checkpoint::load(p, {.require_checksum = false});
  EXPECT_EQ(ck.get<float>("w", {2, 3}).to_vector(), (std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f}));
  EXPECT_EQ(ck.get<int64_t>("b", {2}).to_vector(), (std::vector<int64_t>{1, -2}));
  EXPECT_EQ(ck.get<uint8_t>("u", {}).item(), 200);
  EXPECT_EQ(ck.get<double>("d", {1}).item(), 0.1);
  EXPECT_EQ(ck.get<int32_t>("i", {1, 1}).item(), 7);
  EXPECT_EQ(ck.metadata().at("origin"), "python");
}

}  // namespace
}  // namespace mirrored
