// The checkpoint file format (include/mirrored/checkpoint.hpp): CRC-32, round trips of every dtype
// and the exact safetensors byte layout of a tiny file.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "util/crc32.hpp"
#include "variables/checkpoint_test_util.hpp"

namespace mirrored {
namespace {

using namespace mirrored::testing;  // NOLINT: the checkpoint test helpers
using ::testing::AllOf;
using ::testing::HasSubstr;

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

TEST(CheckpointCrc32, MatchesZlibOnSeveralMegabytes) {
  // zlib.crc32(bytes(i % 251 for i in range((3 << 20) + 5))) in Python.
  std::vector<unsigned char> v((std::size_t{3} << 20) + 5);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>(i % 251);
  EXPECT_EQ(detail::checkpoint_crc32(0, v.data(), v.size()), 0x454448A1u);
  // In uneven pieces, as save and load feed it.
  std::uint32_t crc = 0;
  for (std::size_t off = 0, piece = 1; off < v.size(); off += piece, piece = piece * 3 + 7)
    crc = detail::checkpoint_crc32(crc, v.data() + off, std::min(piece, v.size() - off));
  EXPECT_EQ(crc, 0x454448A1u);
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
  const checkpoint::Metadata meta{
      {"step", "1200"}, {"note", "quotes \" backslash \\ newline \n tab \t ctrl \x01 unicode \xc3\xa9\xe2\x82\xac"}};
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
  EXPECT_THAT(save_leftovers(p), ::testing::IsEmpty());

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
  EXPECT_THAT(save_leftovers(p), ::testing::IsEmpty());
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

TEST_F(CheckpointFormat, FlippedByteDeepInsideALargeTensorFailsTheChecksum) {
  // Load checksums a large tensor piece by piece; every piece counts, the last partial one too.
  const std::size_t n = detail::kCheckpointChunkBytes / sizeof(float) + 77;
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000);
  const std::string good = file("large.safetensors");
  checkpoint::save_tensors(good, {{"w", untyped(Tensor<float>::from_vector(v, {static_cast<int64_t>(n)}))}});
  EXPECT_EQ(checkpoint::load(good).get<float>("w").to_vector(), v);
  const std::string bytes = read_file(good);
  const std::size_t data_start = bytes.size() - n * sizeof(float);
  for (std::size_t at : {data_start + (std::size_t{600} << 10), bytes.size() - 5}) {
    std::string bad = bytes;
    bad[at] ^= 0x01;
    const std::string p = file("large_flip.safetensors");
    write_file(p, bad);
    EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
                AllOf(HasSubstr(p), HasSubstr("checksum mismatch")))
        << "flipped byte at " << at;
  }
}

TEST_F(CheckpointFormat, FilesSavedWithEachCrcKernelLoadWithEveryOther) {
  // The checksum kernel is chosen per CPU: a file written on one machine (or with zlib's fallback)
  // must load on another, and a flipped byte must fail the load whichever kernel checks it.
  struct RestoreKernel {
    detail::Crc32Kernel saved = detail::crc32_kernel();
    ~RestoreKernel() { detail::set_crc32_kernel(saved); }
  } restore;
  const std::size_t n = detail::kCheckpointChunkBytes / sizeof(float) + 4097;  // two chunks, odd tail
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 4093) - 2000.0f;
  const auto w = untyped(Tensor<float>::from_vector(v, {static_cast<int64_t>(n)}));
  std::vector<detail::Crc32Kernel> kernels;
  for (auto k : {detail::Crc32Kernel::kZlib, detail::Crc32Kernel::kPclmul, detail::Crc32Kernel::kVpclmul512})
    if (detail::crc32_kernel_supported(k)) kernels.push_back(k);
  std::string first_file;  // every kernel writes the same bytes, checksum included
  for (const auto writer : kernels) {
    ASSERT_TRUE(detail::set_crc32_kernel(writer));
    const std::string p = file(std::string("w_") + detail::crc32_kernel_name(writer) + ".safetensors");
    checkpoint::save_tensors(p, {{"w", w}, {"b", untyped(Tensor<uint8_t>{7, 8, 9})}});
    std::string bad = read_file(p);
    if (first_file.empty()) first_file = bad;
    EXPECT_TRUE(bad == first_file) << "the file saved with " << detail::crc32_kernel_name(writer) << " differs";
    bad[bad.size() - 100] ^= 0x10;
    const std::string bad_path = p + ".bad";
    write_file(bad_path, bad);
    for (const auto reader : kernels) {
      ASSERT_TRUE(detail::set_crc32_kernel(reader));
      const auto ck = checkpoint::load(p);
      EXPECT_EQ(ck.get<float>("w").to_vector(), v) << "saved with " << detail::crc32_kernel_name(writer)
                                                   << ", loaded with " << detail::crc32_kernel_name(reader);
      EXPECT_EQ(ck.get<uint8_t>("b").to_vector(), (std::vector<uint8_t>{7, 8, 9}));
      EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(bad_path); }),
                  AllOf(HasSubstr(bad_path), HasSubstr("checksum mismatch")))
          << "loaded with " << detail::crc32_kernel_name(reader);
    }
  }
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
  const std::string json = R"({"__metadata__":{"mirrored.checksum":"crc32:f52e9182","mirrored.format":"1"},)"
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

}  // namespace
}  // namespace mirrored
