// File sources: fixed-length records and text lines; their errors name the file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "data_test_util.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using data::TensorSpec;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::message_of;
using testing::TempDir;

std::vector<std::string> strings(const data::Dataset<Tensor<uint8_t>>& ds) {
  std::vector<std::string> out;
  for (const auto& t : ds) out.push_back(data::to_string(t));
  return out;
}

TEST(DataFiles, FixedLengthRecordsOverSeveralFiles) {
  TempDir dir;
  const auto a = dir.write("a.bin", "HHabcdef");    // header 2, two records
  const auto b = dir.write("b.bin", "HHghiFFF");    // header 2, one record, footer 3
  const auto c = dir.write("c.bin", "HHjklmnFFF");  // header 2, footer 3: body of 5 bytes
  EXPECT_EQ(strings(data::fixed_length_record_dataset({a, a}, 3, /*header_bytes=*/2)),
            (std::vector<std::string>{"abc", "def", "abc", "def"}));
  auto ds = data::fixed_length_record_dataset({b, b}, 3, 2, /*footer_bytes=*/3);
  EXPECT_EQ(ds.element_spec(), (TensorSpec{{3}, DType::uint8}));
  EXPECT_EQ(strings(ds), (std::vector<std::string>{"ghi", "ghi"}));
  // A file that is not a whole number of records fails when it is reached, naming it.
  auto bad = data::fixed_length_record_dataset({b, c}, 3, 2, 3);
  auto it = bad.begin();
  EXPECT_EQ(data::to_string(*it.next()), "ghi");
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { it.next(); }),
              AllOf(HasSubstr(c), HasSubstr("has body length 5 bytes"), HasSubstr("record length (3 bytes)")));
}

TEST(DataFiles, RecordsBatchIntoTensors) {
  TempDir dir;
  const auto f = dir.write_int64s("v.bin", {10, 11, 12, 13, 14});
  auto ds = data::fixed_length_record_dataset({f}, 8).map(testing::record_to_int64).batch(2);
  EXPECT_EQ(testing::collect(ds), (std::vector<testing::Rows>{{10, 11}, {12, 13}, {14}}));
}

TEST(DataFiles, MissingFileIsNotFoundNamingIt) {
  TempDir dir;
  const auto present = dir.write_int64s("p.bin", {1});
  const auto missing = dir.path("missing.bin");
  auto ds = data::fixed_length_record_dataset({present, missing}, 8);
  auto it = ds.begin();
  EXPECT_TRUE(it.next().has_value());  // the first file is read before the second is opened
  EXPECT_THAT(message_of<NotFoundError>([&] { it.next(); }), HasSubstr(missing));
  EXPECT_THAT(message_of<NotFoundError>([&] { strings(data::text_line_dataset({missing})); }), HasSubstr(missing));
}

TEST(DataFiles, BadArgumentsFailWhenBuilt) {
  EXPECT_THAT(message_of<InvalidArgumentError>([] { data::fixed_length_record_dataset({"x"}, 0); }),
              HasSubstr("record_bytes must be greater than zero (got 0)"));
  EXPECT_THROW(data::fixed_length_record_dataset({}, 4), InvalidArgumentError);
  EXPECT_THROW(data::fixed_length_record_dataset({"x"}, 4, -1), InvalidArgumentError);
  EXPECT_THROW(data::text_line_dataset({}), InvalidArgumentError);
}

TEST(DataFiles, TextLinesWithoutTerminators) {
  TempDir dir;
  const auto a = dir.write("a.txt", "first\nsecond\r\n\nlast without newline");
  const auto b = dir.write("b.txt", "");
  const auto c = dir.write("c.txt", "x\n");
  auto ds = data::text_line_dataset({a, b, c});
  EXPECT_EQ(ds.element_spec(), (TensorSpec{{-1}, DType::uint8}));
  EXPECT_EQ(strings(ds), (std::vector<std::string>{"first", "second", "", "last without newline", "x"}));
  auto numbers = data::text_line_dataset({dir.write("n.txt", "4\n5\n6\n")}).map([](const Tensor<uint8_t>& line) {
    return Tensor<int64_t>::scalar(std::stoll(data::to_string(line)));
  });
  EXPECT_EQ(testing::collect(numbers.batch(3)), (std::vector<testing::Rows>{{4, 5, 6}}));
}

}  // namespace
}  // namespace mirrored
