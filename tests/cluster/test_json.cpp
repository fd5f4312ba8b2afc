// The strict JSON parser behind TF_CONFIG.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "mirrored/errors.hpp"
#include "util/json.hpp"

namespace mirrored::detail::json {
namespace {

using ::testing::HasSubstr;

std::string error_of(std::string_view text, int max_depth = kDefaultMaxDepth) {
  try {
    parse(text, "TEST", max_depth);
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

TEST(Json, ParsesEveryKindOfValue) {
  const Value v = parse(R"( {"a": [1, -2.5e1, "x\n\u00e9\ud83d\ude00", true, false, null, {}], "b": {"c": 0}} )");
  ASSERT_TRUE(v.is_object());
  const Value* a = v.find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items().size(), 7u);
  EXPECT_EQ(a->items()[0].as_int64(), 1);
  EXPECT_EQ(a->items()[1].as_double(), -25.0);
  EXPECT_EQ(a->items()[1].as_int64(), std::nullopt);  // written with an exponent
  EXPECT_EQ(a->items()[2].as_string(), "x\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(a->items()[3].as_bool());
  EXPECT_FALSE(a->items()[4].as_bool());
  EXPECT_TRUE(a->items()[5].is_null());
  EXPECT_TRUE(a->items()[6].is_object());
  EXPECT_EQ(v.find("b")->find("c")->as_int64(), 0);
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_EQ(v.members()[0].first, "a");  // document order
}

TEST(Json, DuplicateKeysAreAnErrorNamingTheKeyAndItsObject) {
  EXPECT_THAT(error_of(R"({"task": 1, "task": 2})"), HasSubstr("duplicate key \"task\" in the top-level object"));
  EXPECT_THAT(error_of(R"({"cluster": {"worker": [], "worker": []}})"),
              HasSubstr("duplicate key \"worker\" in the object at cluster"));
  // The same key in different objects is fine.
  EXPECT_NO_THROW(parse(R"({"a": {"k": 1}, "b": {"k": 2}})"));
}

TEST(Json, RejectsMalformedDocumentsWithAPosition) {
  EXPECT_THAT(error_of(""), HasSubstr("empty"));
  EXPECT_THAT(error_of("{"), HasSubstr("expected a string key"));
  EXPECT_THAT(error_of(R"({"a" 1})"), HasSubstr("expected ':'"));
  EXPECT_THAT(error_of(R"({"a": 1,})"), HasSubstr("expected a string key"));
  EXPECT_THAT(error_of("[1,]"), HasSubstr("unexpected character"));
  EXPECT_THAT(error_of("[1 2]"), HasSubstr("expected ',' or ']'"));
  EXPECT_THAT(error_of("{} x"), HasSubstr("unexpected text after the value"));
  EXPECT_THAT(error_of("01"), HasSubstr("leading zeros"));
  EXPECT_THAT(error_of("1."), HasSubstr("decimal point"));
  EXPECT_THAT(error_of("-"), HasSubstr("expected a digit"));
  EXPECT_THAT(error_of("1e999"), HasSubstr("out of range"));
  EXPECT_THAT(error_of("NaN"), HasSubstr("unexpected character"));
  EXPECT_THAT(error_of("tru"), HasSubstr("unexpected character"));
  EXPECT_THAT(error_of("\"abc"), HasSubstr("unterminated string"));
  EXPECT_THAT(error_of("\"a\tb\""), HasSubstr("control character"));
  EXPECT_THAT(error_of(R"("\x")"), HasSubstr("unknown escape"));
  EXPECT_THAT(error_of(R"("\u12")"), HasSubstr("\\u escape"));
  EXPECT_THAT(error_of("{\n  \"a\": ?}"), HasSubstr("at line 2, column 8"));
  EXPECT_THAT(error_of("{\"a\": ?}"), HasSubstr("TEST is not valid JSON"));
}

TEST(Json, StringsMustBeValidUtf8WithoutLoneSurrogates) {
  EXPECT_THAT(error_of("\"\xff\""), HasSubstr("invalid UTF-8"));
  EXPECT_THAT(error_of("\"\xc0\xaf\""), HasSubstr("invalid UTF-8"));          // overlong '/'
  EXPECT_THAT(error_of("\"\xed\xa0\x80\""), HasSubstr("invalid UTF-8"));      // an encoded surrogate
  EXPECT_THAT(error_of("\"\xf4\x90\x80\x80\""), HasSubstr("invalid UTF-8"));  // above U+10FFFF
  EXPECT_THAT(error_of("\"\xe2\x82\""), HasSubstr("invalid UTF-8"));          // truncated
  EXPECT_THAT(error_of(R"("\ud800")"), HasSubstr("high surrogate"));
  EXPECT_THAT(error_of(R"("\udc00")"), HasSubstr("lone low surrogate"));
  EXPECT_THAT(error_of(R"("\ud800\u0041")"), HasSubstr("high surrogate"));
  EXPECT_EQ(parse("\"\xe2\x82\xac\"").as_string(), "\xe2\x82\xac");  // €
}

TEST(Json, NestingIsLimited) {
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  EXPECT_THAT(error_of(deep), HasSubstr("nesting deeper than 64 levels"));
  EXPECT_NO_THROW(parse(std::string(64, '[') + std::string(64, ']')));
  EXPECT_THAT(error_of("[[[]]]", 2), HasSubstr("nesting deeper than 2"));
}

TEST(Json, HostileKeysArePrintedEscapedAndCut) {
  const std::string key(200, 'k');
  const std::string msg = error_of("{\"" + key + "\": 1, \"" + key + "\": 2}");
  EXPECT_THAT(msg, HasSubstr("duplicate key"));
  EXPECT_THAT(msg, HasSubstr("..."));
  EXPECT_LT(msg.size(), 300u);
  EXPECT_THAT(error_of("{\"a\\u0001\": 1, \"a\\u0001\": 2}"), HasSubstr("a\\x01"));
}

TEST(Json, IntegersConvertExactly) {
  EXPECT_EQ(parse("9223372036854775807").as_int64(), INT64_MAX);
  EXPECT_EQ(parse("9223372036854775808").as_int64(), std::nullopt);
  EXPECT_EQ(parse("-0").as_int64(), 0);
  EXPECT_EQ(parse("1.0").as_int64(), std::nullopt);
}

}  // namespace
}  // namespace mirrored::detail::json
