// The UTF-8 helpers the checkpoint header and TF_CONFIG parsers share.
#include <gtest/gtest.h>

#include <string>

#include "util/utf8.hpp"

namespace mirrored::detail {
namespace {

TEST(Utf8, SequenceLengthsOfWellFormedText) {
  const std::string s = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";  // a, é, €, 😀
  EXPECT_EQ(utf8_sequence_length(s, 0), 1u);
  EXPECT_EQ(utf8_sequence_length(s, 1), 2u);
  EXPECT_EQ(utf8_sequence_length(s, 3), 3u);
  EXPECT_EQ(utf8_sequence_length(s, 6), 4u);
  EXPECT_EQ(utf8_sequence_length(s, s.size()), 0u);
  EXPECT_TRUE(valid_utf8(s));
  EXPECT_TRUE(valid_utf8(""));
}

TEST(Utf8, RejectsOverlongSurrogatesTooLargeTruncatedAndStrayBytes) {
  EXPECT_FALSE(valid_utf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(valid_utf8("\xe0\x80\xaf"));      // overlong, 3 bytes
  EXPECT_FALSE(valid_utf8("\xf0\x80\x80\xaf"));  // overlong, 4 bytes
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));      // U+D800, a surrogate
  EXPECT_FALSE(valid_utf8("\xf4\x90\x80\x80"));  // U+110000
  EXPECT_FALSE(valid_utf8("\xe2\x82"));          // truncated
  EXPECT_FALSE(valid_utf8("\x80"));              // a lone continuation byte
  EXPECT_FALSE(valid_utf8("\xff"));
  EXPECT_TRUE(valid_utf8("\xed\x9f\xbf"));      // U+D7FF, just below the surrogates
  EXPECT_TRUE(valid_utf8("\xf4\x8f\xbf\xbf"));  // U+10FFFF, the last code point
}

TEST(Utf8, AppendEncodesEveryLengthAndRoundTrips) {
  for (std::uint32_t cp : {0x0u, 0x41u, 0x7fu, 0x80u, 0x7ffu, 0x800u, 0xd7ffu, 0xe000u, 0xffffu, 0x10000u, 0x10ffffu}) {
    std::string out;
    append_utf8(out, cp);
    const std::size_t expected = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    EXPECT_EQ(out.size(), expected) << cp;
    EXPECT_EQ(utf8_sequence_length(out, 0), expected) << cp;
  }
  std::string euro;
  append_utf8(euro, 0x20ac);
  EXPECT_EQ(euro, "\xe2\x82\xac");
}

}  // namespace
}  // namespace mirrored::detail
