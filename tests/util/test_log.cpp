// The private log header compiles next to the macros that common headers and build flags define.
#define DEBUG 1
#define INFO 2
#define WARN 3
#define ERROR 0
#define OFF 4

#include <gtest/gtest.h>

#include "util/log.hpp"

namespace mirrored::detail {
namespace {

TEST(Log, LevelsAreOrderedAndSurviveCommonMacros) {
  EXPECT_LT(LogLevel::debug, LogLevel::info);
  EXPECT_LT(LogLevel::info, LogLevel::warn);
  EXPECT_LT(LogLevel::warn, LogLevel::error);
  EXPECT_LT(LogLevel::error, LogLevel::off);
  EXPECT_FALSE(log_enabled(LogLevel::off));
  MIRRORED_LOG(debug, "a debug line (printed only with MIRRORED_LOG_LEVEL=DEBUG)");
  EXPECT_EQ(DEBUG + INFO + WARN + ERROR + OFF, 10);  // the macros are still the user's
}

}  // namespace
}  // namespace mirrored::detail
