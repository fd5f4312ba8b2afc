// Unit tests for the error types and helpers (docs/api.md §8), ReduceOp parsing and printing
// (§4), and the environment-variable helper used for timeouts.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "mirrored/errors.hpp"
#include "mirrored/reduce_op.hpp"
#include "util/log.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// Error subclasses
// ---------------------------------------------------------------------------------------------

struct ErrorCase {
  std::string name;
  std::function<void(const std::string&)> raise;
  ErrorCode code;
  int numeric_code;
  std::string code_name;
};

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

template <class E>
ErrorCase make_case(const char* name, ErrorCode code, int numeric, const char* code_name) {
  return ErrorCase{name, [](const std::string& m) { throw E(m); }, code, numeric, code_name};
}

class ErrorTypeTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ErrorTypeTest, HasCodeAndName) {
  const ErrorCase& c = GetParam();
  EXPECT_EQ(static_cast<int>(c.code), c.numeric_code);
  EXPECT_STREQ(error_code_name(c.code), c.code_name.c_str());
  try {
    c.raise("boom");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), c.code);
    EXPECT_STREQ(error_code_name(e.code()), c.code_name.c_str());
    EXPECT_STREQ(e.what(), "boom");
  }
}

TEST_P(ErrorTypeTest, CatchableAsRuntimeError) {
  const ErrorCase& c = GetParam();
  try {
    c.raise("message text");
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "message text");
    const auto* base = dynamic_cast<const Error*>(&e);
    ASSERT_NE(base, nullptr);
    EXPECT_EQ(base->code(), c.code);
  }
}

TEST_P(ErrorTypeTest, CatchableAsStdException) {
  const ErrorCase& c = GetParam();
  EXPECT_THROW(c.raise("x"), std::exception);
}

INSTANTIATE_TEST_SUITE_P(
    AllErrors, ErrorTypeTest,
    ::testing::Values(
        make_case<InvalidArgumentError>("InvalidArgumentError", ErrorCode::INVALID_ARGUMENT, 3, "INVALID_ARGUMENT"),
        make_case<DeadlineExceededError>("DeadlineExceededError", ErrorCode::DEADLINE_EXCEEDED, 4, "DEADLINE_EXCEEDED"),
        make_case<NotFoundError>("NotFoundError", ErrorCode::NOT_FOUND, 5, "NOT_FOUND"),
        make_case<PermissionDeniedError>("PermissionDeniedError", ErrorCode::PERMISSION_DENIED, 7, "PERMISSION_DENIED"),
        make_case<FailedPreconditionError>("FailedPreconditionError", ErrorCode::FAILED_PRECONDITION, 9,
                                           "FAILED_PRECONDITION"),
        make_case<AbortedError>("AbortedError", ErrorCode::ABORTED, 10, "ABORTED"),
        make_case<OutOfRangeError>("OutOfRangeError", ErrorCode::OUT_OF_RANGE, 11, "OUT_OF_RANGE"),
        make_case<UnimplementedError>("UnimplementedError", ErrorCode::UNIMPLEMENTED, 12, "UNIMPLEMENTED"),
        make_case<InternalError>("InternalError", ErrorCode::INTERNAL, 13, "INTERNAL"),
        make_case<UnavailableError>("UnavailableError", ErrorCode::UNAVAILABLE, 14, "UNAVAILABLE")),
    [](const ::testing::TestParamInfo<ErrorCase>& info) { return info.param.name; });

TEST(Errors, SubclassesAreDistinct) {
  // A specific handler does not catch a sibling type.
  try {
    throw NotFoundError("n");
  } catch (const InvalidArgumentError&) {
    FAIL() << "NotFoundError caught as InvalidArgumentError";
  } catch (const NotFoundError& e) {
    EXPECT_EQ(e.code(), ErrorCode::NOT_FOUND);
  }
  static_assert(std::is_base_of_v<Error, InvalidArgumentError>);
  static_assert(std::is_base_of_v<std::runtime_error, Error>);
  static_assert(!std::is_base_of_v<InvalidArgumentError, OutOfRangeError>);
}

TEST(Errors, BaseErrorCarriesAnyCode) {
  const Error e(ErrorCode::ABORTED, "stopped");
  EXPECT_EQ(e.code(), ErrorCode::ABORTED);
  EXPECT_STREQ(e.what(), "stopped");
}

TEST(Errors, UnknownCodeName) { EXPECT_STREQ(error_code_name(static_cast<ErrorCode>(999)), "UNKNOWN"); }

// ---------------------------------------------------------------------------------------------
// MIRRORED_ENFORCE / MIRRORED_ENFORCE_EQ / str_cat
// ---------------------------------------------------------------------------------------------

TEST(StrCat, ConcatenatesStreamables) { EXPECT_EQ(detail::str_cat("a", 1, ' ', 2.5, std::string("z")), "a1 2.5z"); }

TEST(Enforce, PassesSilentlyWhenTrue) {
  EXPECT_NO_THROW(MIRRORED_ENFORCE(1 + 1 == 2, InvalidArgumentError, "unused"));
  const int a = 3, b = 3;
  EXPECT_NO_THROW(MIRRORED_ENFORCE_EQ(a, b, InvalidArgumentError, "unused"));
}

TEST(Enforce, ThrowsTheGivenTypeWithTheMessage) {
  const int n = 5, limit = 4;
  try {
    MIRRORED_ENFORCE(n <= limit, OutOfRangeError, "value ", n, " exceeds limit ", limit);
    FAIL() << "no exception";
  } catch (const OutOfRangeError& e) {
    EXPECT_STREQ(e.what(), "value 5 exceeds limit 4");
  }
}

TEST(Enforce, EvaluatesTheConditionOnce) {
  int calls = 0;
  auto check = [&] { return ++calls > 0; };
  MIRRORED_ENFORCE(check(), InternalError, "x");
  EXPECT_EQ(calls, 1);
}

TEST(EnforceEq, MessageShowsBothValues) {
  const int lhs = 2, rhs = 3;
  try {
    MIRRORED_ENFORCE_EQ(lhs, rhs, InvalidArgumentError, "sizes differ");
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_STREQ(e.what(), "sizes differ (lhs = 2 vs rhs = 3)");
  }
}

TEST(EnforceEq, WorksWithStringsAndExpressions) {
  const std::string a = "left";
  try {
    MIRRORED_ENFORCE_EQ(a, std::string("right"), FailedPreconditionError, "names: ", 1);
    FAIL() << "no exception";
  } catch (const FailedPreconditionError& e) {
    EXPECT_THAT(e.what(), HasSubstr("names: 1"));
    EXPECT_THAT(e.what(), HasSubstr("left"));
    EXPECT_THAT(e.what(), HasSubstr("right"));
  }
  std::vector<int> v = {1, 2, 3};
  try {
    MIRRORED_ENFORCE_EQ(v.size(), 4u, InvalidArgumentError, "bad size");
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad size"));
    EXPECT_THAT(e.what(), HasSubstr("= 3"));
    EXPECT_THAT(e.what(), HasSubstr("= 4"));
  }
}

TEST(EnforceEq, EvaluatesEachOperandOnce) {
  int left = 0, right = 0;
  auto l = [&] { return ++left; };
  auto r = [&] { return ++right; };
  MIRRORED_ENFORCE_EQ(l(), r(), InternalError, "x");
  EXPECT_EQ(left, 1);
  EXPECT_EQ(right, 1);
}

// ---------------------------------------------------------------------------------------------
// ReduceOp
// ---------------------------------------------------------------------------------------------

TEST(ParseReduceOp, CaseInsensitive) {
  EXPECT_EQ(parse_reduce_op("SUM"), ReduceOp::SUM);
  EXPECT_EQ(parse_reduce_op("sum"), ReduceOp::SUM);
  EXPECT_EQ(parse_reduce_op("Sum"), ReduceOp::SUM);
  EXPECT_EQ(parse_reduce_op("sUm"), ReduceOp::SUM);
  EXPECT_EQ(parse_reduce_op("MEAN"), ReduceOp::MEAN);
  EXPECT_EQ(parse_reduce_op("Mean"), ReduceOp::MEAN);
  EXPECT_EQ(parse_reduce_op("mean"), ReduceOp::MEAN);
  EXPECT_EQ(parse_reduce_op(std::string("mEaN")), ReduceOp::MEAN);
}

TEST(ParseReduceOp, MaxIsInvalidArgumentWithTfMessage) {
  try {
    (void)parse_reduce_op("MAX");
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_EQ(e.code(), ErrorCode::INVALID_ARGUMENT);
    EXPECT_STREQ(e.what(), "'MAX' is not a valid ReduceOp");
  }
}

TEST(ParseReduceOp, OtherInvalidNames) {
  EXPECT_THROW((void)parse_reduce_op(""), InvalidArgumentError);
  EXPECT_THROW((void)parse_reduce_op("SUM "), InvalidArgumentError);
  EXPECT_THROW((void)parse_reduce_op("ReduceOp.SUM"), InvalidArgumentError);
  EXPECT_THROW((void)parse_reduce_op("MIN"), InvalidArgumentError);
  try {
    (void)parse_reduce_op("PROD");
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_STREQ(e.what(), "'PROD' is not a valid ReduceOp");
  }
}

// TF parses a string op as `ReduceOp(reduce_op.upper())`, so the message names the upper-cased
// string: strategy.reduce("max", ...) raises "'MAX' is not a valid ReduceOp".
TEST(ParseReduceOp, InvalidNameIsReportedUpperCasedLikeTf) {
  try {
    (void)parse_reduce_op("max");
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_STREQ(e.what(), "'MAX' is not a valid ReduceOp");
  }
}

TEST(ReduceOpPrint, LikeTfEnum) {
  std::ostringstream os;
  os << ReduceOp::SUM;
  EXPECT_EQ(os.str(), "ReduceOp.SUM");
  std::ostringstream os2;
  os2 << ReduceOp::MEAN << " " << parse_reduce_op("sum");
  EXPECT_EQ(os2.str(), "ReduceOp.MEAN ReduceOp.SUM");
  EXPECT_STREQ(reduce_op_name(ReduceOp::SUM), "SUM");
  EXPECT_STREQ(reduce_op_name(ReduceOp::MEAN), "MEAN");
}

// ---------------------------------------------------------------------------------------------
// detail::env_positive
// ---------------------------------------------------------------------------------------------

class EnvSecondsTest : public ::testing::Test {
 protected:
  static constexpr const char* kVar = "MIRRORED_TEST_ERRORS_ENV_SECONDS";
  void SetUp() override { ::unsetenv(kVar); }
  void TearDown() override { ::unsetenv(kVar); }
  double read(const char* value, double fallback = 7.0) {
    ::setenv(kVar, value, 1);
    return detail::env_positive(kVar, fallback);
  }
};

TEST_F(EnvSecondsTest, MissingFallsBack) {
  EXPECT_EQ(detail::env_positive(kVar, 7.0), 7.0);
  EXPECT_EQ(detail::env_positive(kVar, 1800.0), 1800.0);
}

TEST_F(EnvSecondsTest, ReadsPositiveNumbers) {
  EXPECT_EQ(read("2.5"), 2.5);
  EXPECT_EQ(read("30"), 30.0);
  EXPECT_EQ(read("0.25"), 0.25);
  EXPECT_EQ(read("1e2"), 100.0);
}

TEST_F(EnvSecondsTest, EmptyFallsBack) { EXPECT_EQ(read(""), 7.0); }

TEST_F(EnvSecondsTest, GarbageFallsBack) {
  EXPECT_EQ(read("abc"), 7.0);
  EXPECT_EQ(read("5s"), 7.0);
  EXPECT_EQ(read("1.5.2"), 7.0);
  EXPECT_EQ(read("nan"), 7.0);
}

TEST_F(EnvSecondsTest, NonPositiveFallsBack) {
  EXPECT_EQ(read("-3"), 7.0);
  EXPECT_EQ(read("-0.5"), 7.0);
  EXPECT_EQ(read("0"), 7.0);
  EXPECT_EQ(read("0.0"), 7.0);
}

TEST_F(EnvSecondsTest, UnsetAfterSetFallsBackAgain) {
  EXPECT_EQ(read("4"), 4.0);
  ::unsetenv(kVar);
  EXPECT_EQ(detail::env_positive(kVar, 9.0), 9.0);
}

}  // namespace
}  // namespace mirrored
