// Checkpoints of float16 and bfloat16 tensors (safetensors F16 and BF16), and the message for a
// dtype that safetensors has but mirrored cannot hold.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "mirrored/half.hpp"
#include "variables/checkpoint_test_util.hpp"

namespace mirrored {
namespace {

using namespace mirrored::testing;  // NOLINT: the checkpoint test helpers
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

template <class H>
Tensor<H> every_bit_pattern() {
  std::vector<H> v;
  for (std::uint32_t b = 0; b <= 0xffff; ++b) v.push_back(H::from_bits(static_cast<std::uint16_t>(b)));
  return Tensor<H>::from_vector(v, {256, 256});
}

template <class H>
std::vector<std::uint16_t> bits_of(const Tensor<H>& t) {
  std::vector<std::uint16_t> out;
  for (H h : t.to_vector()) out.push_back(h.bits());
  return out;
}

TEST_F(CheckpointFormat, Float16AndBFloat16RoundTripBitExact) {
  const std::string p = file("half.safetensors");
  const auto h = every_bit_pattern<float16>();  // NaNs and signalling NaNs included
  const auto b = every_bit_pattern<bfloat16>();
  const auto s = Tensor<float16>::from_vector({float16(1.5f), float16(-0.0f), float16(65504.0f)}, {3});
  checkpoint::save_tensors(p, {{"h", checkpoint::untyped(h)},
                               {"b", checkpoint::untyped(b)},
                               {"s", checkpoint::untyped(s)},
                               {"e", checkpoint::untyped(Tensor<bfloat16>::zeros({0, 3}))}});
  const std::string raw = read_file(p);
  const std::string header = raw.substr(0, raw.find("}}") + 2);  // printed on failure, not the data
  EXPECT_THAT(header, HasSubstr("\"h\":{\"dtype\":\"F16\",\"shape\":[256,256]"));
  EXPECT_THAT(header, HasSubstr("\"b\":{\"dtype\":\"BF16\",\"shape\":[256,256]"));
  // Little-endian 2-byte elements: 1.5 is 0x3e00, -0 is 0x8000, 65504 is 0x7bff (the last tensor).
  EXPECT_EQ(raw.substr(raw.size() - 6), std::string("\x00\x3e\x00\x80\xff\x7b", 6));

  const auto ck = checkpoint::load(p);
  EXPECT_EQ(bits_of(ck.get<float16>("h", {256, 256})), bits_of(h));
  EXPECT_EQ(bits_of(ck.get<bfloat16>("b", {256, 256})), bits_of(b));
  EXPECT_EQ(bits_of(ck.get<float16>("s", {3})), (std::vector<std::uint16_t>{0x3e00, 0x8000, 0x7bff}));
  EXPECT_EQ(ck.get<bfloat16>("e", {0, 3}).numel(), 0);
  EXPECT_THAT(error_of<InvalidArgumentError>([&] {
                ck.get<float>("h", {256, 256});
              }),
              HasSubstr("tensor 'h': dtype mismatch: the file has float16, expected float32"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] {
                ck.get<float16>("b", {256, 256});
              }),
              HasSubstr("tensor 'b': dtype mismatch: the file has bfloat16, expected float16"));
  EXPECT_STREQ(checkpoint::safetensors_dtype_name(DType::float16), "F16");
  EXPECT_STREQ(checkpoint::safetensors_dtype_name(DType::bfloat16), "BF16");
}

TEST_F(CheckpointFormat, HalfFilesWrittenByHandLoad) {
  // A file as any safetensors writer lays it out: F16 [1.0, -2.0], BF16 [0.5], no checksum.
  const std::string p = file("by_hand.safetensors");
  write_file(p, make_file(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"BF16","shape":[],"data_offsets":[4,6]}})",
                          std::string("\x00\x3c\x00\xc0\x00\x3f", 6)));
  const auto ck = checkpoint::load(p, {.require_checksum = false});
  const auto a = ck.get<float16>("a", {2}).to_vector();
  EXPECT_EQ(float(a[0]), 1.0f);
  EXPECT_EQ(float(a[1]), -2.0f);
  EXPECT_EQ(float(ck.get<bfloat16>("b", {}).item()), 0.5f);
}

TEST_F(CheckpointFormat, ADtypeMirroredCannotHoldIsNamedWithItsTensor) {
  // Valid safetensors headers (dtypes the format has), not corrupt ones: the message names the
  // tensor and its dtype.
  for (const auto& [dtype, bytes] : std::vector<std::pair<std::string, int>>{{"F8_E4M3", 2}, {"C64", 16}, {"I16", 4}}) {
    const std::string p = file("other_" + dtype + ".safetensors");
    write_file(p, make_file(R"({"ok":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("layer/weird":{"dtype":")" +
                                dtype + R"(","shape":[2],"data_offsets":[4,)" + std::to_string(4 + bytes) + "]}}",
                            std::string(static_cast<std::size_t>(4 + bytes), '\0')));
    EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p, {.require_checksum = false}); }),
                AllOf(HasSubstr(p), HasSubstr("tensor 'layer/weird' has unsupported dtype '" + dtype + "'"),
                      HasSubstr("F16, BF16"), Not(HasSubstr("corrupt header"))))
        << dtype;
  }
}

}  // namespace
}  // namespace mirrored
