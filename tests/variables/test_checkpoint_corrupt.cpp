// The checkpoint file format: every kind of corrupt or truncated file, and name/dtype/shape errors.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "variables/checkpoint_test_util.hpp"

namespace mirrored {
namespace {

using namespace mirrored::testing;  // NOLINT: the checkpoint test helpers
using ::testing::AllOf;
using ::testing::HasSubstr;

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
              AllOf(HasSubstr("corrupt header"), HasSubstr("not valid JSON: unexpected character 'x'")));
  write_file(p, damaged("\"shape\":[2]", "\"shape\":\"2\""));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
              AllOf(HasSubstr("corrupt header"), HasSubstr("tensor 'a'"),
                    HasSubstr("expected an array of shape dimensions, found string")));
  write_file(p, damaged("\"dtype\":\"F32\"", "\"dtype\":\"C64\""));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
              AllOf(HasSubstr("tensor 'a'"), HasSubstr("unsupported dtype 'C64'")));
  write_file(p, damaged("\"shape\":[2]", "\"shape\":[3]"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
              AllOf(HasSubstr("tensor 'a'"), HasSubstr("span 8 bytes, but F32 shape (3,) needs 12")));
  write_file(p, damaged("\"shape\":[2]", "\"shapf\":[2]"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
              AllOf(HasSubstr("tensor 'a'"), HasSubstr("unexpected key 'shapf'")));
  write_file(p, damaged("crc32:", "crc33:"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }), HasSubstr("expected 'crc32:'"));
  write_file(p, damaged("\"mirrored.format\":\"1\"", "\"mirrored.format\":\"9\""));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }),
              HasSubstr("unsupported mirrored.format '9'"));

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
              AllOf(HasSubstr("corrupt header"), HasSubstr("duplicate key \"x\" in the top-level object")));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[4],"data_offsets":[0,16]}} junk)"),
              AllOf(HasSubstr("corrupt header"), HasSubstr("unexpected text after the value")));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[4],"data_offsets":[0,16]},"__metadata__":{"k":1}})"),
              HasSubstr("value of 'k' is not a string"));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[99999999999999999999],"data_offsets":[0,16]}})"),
              HasSubstr("too large"));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[-4],"data_offsets":[0,16]}})"),
              HasSubstr("non-negative integer"));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[4],"data_offsets":[0,16]})"),
              AllOf(HasSubstr("corrupt header"), HasSubstr("expected ',' or '}' in an object")));
}

// Regression: a header shape whose element count overflows int64 was accepted
// when another dimension was 0 (0 data bytes), giving a tensor whose row size overflows.
TEST_F(CheckpointFormat, HeaderShapesThatOverflowAreRejected) {
  const std::string p = file("huge.safetensors");
  auto load_msg = [&](const std::string& header) {
    write_file(p, make_file(header, ""));
    return error_of<InvalidArgumentError>([&] { checkpoint::load(p, {.require_checksum = false}); });
  };
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"I32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})"),
              AllOf(HasSubstr(p), HasSubstr("tensor 'x'"), HasSubstr("(0, 4294967296, 4294967296) is too large")));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"),
              AllOf(HasSubstr("tensor 'x'"), HasSubstr("is too large")));
  EXPECT_THAT(load_msg(R"({"x":{"dtype":"F64","shape":[1152921504606846976],"data_offsets":[0,0]}})"),
              AllOf(HasSubstr("tensor 'x'"), HasSubstr("is too large")));
  // Large but representable empty tensors load.
  write_file(p, make_file(R"({"x":{"dtype":"F32","shape":[0,4294967296],"data_offsets":[0,0]}})", ""));
  EXPECT_EQ(checkpoint::load(p, {.require_checksum = false}).at("x").shape, (Shape{0, int64_t{1} << 32}));
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
  EXPECT_THAT(error_of<InvalidArgumentError>([&] {
                ck.get<int32_t>("b", {3, 2});
              }),
              AllOf(HasSubstr(p), HasSubstr("tensor 'b': shape mismatch: the file has (2, 3), expected (3, 2)")));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { ck.check("a", DType::float32, {}); }),
              HasSubstr("shape mismatch: the file has (2,), expected ()"));
  EXPECT_NO_THROW(ck.check("b", DType::int32, {2, 3}));
}

TEST_F(CheckpointFormat, SaveRejectsReservedNamesAndMissingDirectories) {
  const std::string p = file("r.safetensors");
  const auto t = untyped(Tensor<float>{1.0f});
  EXPECT_THAT(error_of<InvalidArgumentError>([&] {
                checkpoint::save_tensors(p, {{"__metadata__", t}});
              }),
              HasSubstr("'__metadata__' cannot be a tensor name"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] {
                checkpoint::save_tensors(p, {{"w", t}}, {{"mirrored.checksum", "x"}});
              }),
              HasSubstr("reserved"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] {
                checkpoint::save_tensors(p, {{"bad\xff", t}});
              }),
              HasSubstr("not valid UTF-8"));
  EXPECT_FALSE(fs::exists(p));
  const std::string nodir = file("missing/dir/x.safetensors");
  EXPECT_THAT(error_of<NotFoundError>([&] { checkpoint::save_tensors(nodir, {{"w", t}}); }), HasSubstr(nodir));
}

}  // namespace
}  // namespace mirrored
