// Logging: levels that survive common macros, the sink and threshold of <mirrored/logging.hpp>, and
// environment numbers whose bad values are reported once.
#define DEBUG 1
#define INFO 2
#define WARN 3
#define ERROR 0
#define OFF 4

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/logging.hpp"
#include "util/log.hpp"

namespace mirrored::detail {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Captures log lines for the duration of a test and restores stderr and WARN after it.
class CapturedLog : public ::testing::Test {
 protected:
  void SetUp() override {
    set_log_sink([this](LogLevel level, std::string_view message) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(std::string(log_level_name(level)) + " " + std::string(message));
    });
  }
  void TearDown() override {
    set_log_sink(nullptr);
    set_log_level(LogLevel::warn);
  }
  std::vector<std::string> lines() {
    std::lock_guard lock(mu_);
    return lines_;
  }
  std::mutex mu_;
  std::vector<std::string> lines_;
};

TEST(Log, LevelsAreOrderedAndSurviveCommonMacros) {
  EXPECT_LT(LogLevel::debug, LogLevel::info);
  EXPECT_LT(LogLevel::info, LogLevel::warn);
  EXPECT_LT(LogLevel::warn, LogLevel::error);
  EXPECT_LT(LogLevel::error, LogLevel::off);
  EXPECT_FALSE(log_enabled(LogLevel::off));
  EXPECT_STREQ(log_level_name(LogLevel::error), "ERROR");
  EXPECT_EQ(DEBUG + INFO + WARN + ERROR + OFF, 10);  // the macros are still the user's
}

TEST_F(CapturedLog, TheSinkReceivesLinesAtOrAboveTheThreshold) {
  set_log_level(LogLevel::info);
  MIRRORED_LOG(debug, "not produced");
  MIRRORED_LOG(info, "produced ", 1);
  MIRRORED_LOG(error, "produced ", 2);
  set_log_level(LogLevel::debug);
  MIRRORED_LOG(debug, "now produced");
  set_log_level(LogLevel::off);
  MIRRORED_LOG(error, "nothing at OFF");
  EXPECT_THAT(lines(), ElementsAre("INFO produced 1", "ERROR produced 2", "DEBUG now produced"));
}

TEST_F(CapturedLog, ABadEnvironmentValueIsReportedOnce) {
  ::setenv("MIRRORED_TEST_SECONDS", "soon", 1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(env_positive("MIRRORED_TEST_SECONDS", 7.0), 7.0);
  ::setenv("MIRRORED_TEST_SECONDS", "-1", 1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(env_positive("MIRRORED_TEST_SECONDS", 7.0), 7.0);
  ::setenv("MIRRORED_TEST_SECONDS", "2.5", 1);
  EXPECT_EQ(env_positive("MIRRORED_TEST_SECONDS", 7.0), 2.5);
  ::setenv("MIRRORED_TEST_SECONDS", "0", 1);
  EXPECT_EQ(env_positive("MIRRORED_TEST_SECONDS", 7.0), 7.0);      // not positive
  EXPECT_EQ(env_non_negative("MIRRORED_TEST_SECONDS", 7.0), 0.0);  // but a valid size
  ::unsetenv("MIRRORED_TEST_SECONDS");
  const auto got = lines();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_THAT(got[0], HasSubstr("MIRRORED_TEST_SECONDS='soon' is not a positive number; using 7"));
  EXPECT_THAT(got[1], HasSubstr("MIRRORED_TEST_SECONDS='-1' is not a positive number"));
  EXPECT_THAT(got[2], HasSubstr("MIRRORED_TEST_SECONDS='0' is not a positive number"));
}

}  // namespace
}  // namespace mirrored::detail
