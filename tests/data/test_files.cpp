// File sources: fixed-length records and text lines; their errors name the file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <limits>

#include "data_test_util.hpp"
#include "fs_test_util.hpp"
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

// Regression: a read error ended the file as if it were its end, losing the
// rest of the data silently. /proc/self/mem is a regular file whose read at offset 0 fails (EIO).
TEST(DataFiles, TextLineReadErrorIsAnErrorNamingTheFileAndErrno) {
  if (!std::filesystem::exists("/proc/self/mem")) GTEST_SKIP() << "no /proc/self/mem to fail a read";
  EXPECT_THAT(message_of<UnavailableError>([] { strings(data::text_line_dataset({"/proc/self/mem"})); }),
              AllOf(HasSubstr("text_line_dataset: reading '/proc/self/mem' failed"), HasSubstr("Input/output error")));
}

// Regression: header/footer sizes near INT64_MAX overflowed `size - header -
// footer` (UBSan) and the file was then blamed for changing while read.
TEST(DataFiles, HeaderAndFooterSizesNearInt64MaxAreRejectedWithoutOverflow) {
  TempDir dir;
  const auto f = dir.write("r.bin", "HHabcdFF");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  auto msg = [&](int64_t header, int64_t footer) {
    return message_of<InvalidArgumentError>(
        [&] { strings(data::fixed_length_record_dataset({f}, 1, header, footer)); });
  };
  EXPECT_THAT(msg(kMax, kMax), AllOf(HasSubstr(f), HasSubstr("has 8 bytes, fewer than its header (9223372036854775807 "
                                                             "bytes) and footer (9223372036854775807 bytes)")));
  EXPECT_THAT(msg(kMax, 0), HasSubstr("fewer than its header"));
  EXPECT_THAT(msg(0, kMax), HasSubstr("fewer than its header"));
  EXPECT_THAT(msg(4, kMax - 2), HasSubstr("fewer than its header"));
  EXPECT_THAT(msg(5, 4), HasSubstr("fewer than its header (5 bytes) and footer (4 bytes)"));
  EXPECT_EQ(strings(data::fixed_length_record_dataset({f}, 2, 2, 2)), (std::vector<std::string>{"ab", "cd"}));
  EXPECT_EQ(strings(data::fixed_length_record_dataset({f}, 2, 4, 4)), (std::vector<std::string>{}));
}

// Regression: a directory was reported as "No such file or directory".
TEST(DataFiles, DirectoryIsInvalidArgumentSayingSo) {
  TempDir dir;
  const std::string d = dir.path("");
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { strings(data::text_line_dataset({d})); }),
              AllOf(HasSubstr("text_line_dataset"), HasSubstr(d), HasSubstr("is a directory")));
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { strings(data::fixed_length_record_dataset({d}, 4)); }),
              AllOf(HasSubstr("fixed_length_record_dataset"), HasSubstr("is a directory")));
}

TEST(DataFiles, FifoIsRefusedWithoutBlocking) {
  TempDir dir;
  const std::string p = dir.path("pipe");
  ASSERT_EQ(::mkfifo(p.c_str(), 0644), 0);
  std::string lines, records;
  const bool in_time = testing::finishes_within(
      std::chrono::milliseconds(5000),
      [&] {
        lines = message_of<InvalidArgumentError>([&] { strings(data::text_line_dataset({p})); });
        records = message_of<InvalidArgumentError>([&] { strings(data::fixed_length_record_dataset({p}, 4)); });
      },
      [&] { testing::release_fifo_reader(p); });
  EXPECT_TRUE(in_time) << "opening a FIFO blocked";
  EXPECT_THAT(lines, AllOf(HasSubstr(p), HasSubstr("is not a regular file (it is a FIFO)")));
  EXPECT_THAT(records, AllOf(HasSubstr(p), HasSubstr("is not a regular file (it is a FIFO)")));
}

// Regression: an unreadable file was reported as "No such file or directory".
TEST(DataFiles, UnreadableFileIsPermissionDeniedWithTheErrnoText) {
  TempDir dir;
  const auto f = dir.write("secret.txt", "a\nb\n");
  std::filesystem::permissions(f, std::filesystem::perms::none);
  const auto result = testing::run_unprivileged([&]() -> int {
    for (bool lines : {true, false}) {
      try {
        if (lines)
          strings(data::text_line_dataset({f}));
        else
          strings(data::fixed_length_record_dataset({f}, 1));
        return 1;
      } catch (const PermissionDeniedError& e) {
        const std::string m = e.what();
        if (m.find(f) == std::string::npos || m.find("Permission denied") == std::string::npos) return 2;
      } catch (...) {
        return 3;
      }
    }
    return 0;
  });
  if (!result) GTEST_SKIP() << "running as root without the right to drop privileges: chmod 000 does not deny";
  EXPECT_EQ(*result, 0) << "1: read, 2: message lacks the path or the errno text, 3: another error type";
}

}  // namespace
}  // namespace mirrored
