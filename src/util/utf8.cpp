#include "util/utf8.hpp"

namespace mirrored::detail {

std::size_t utf8_sequence_length(std::string_view s, std::size_t pos) noexcept {
  auto at = [&](std::size_t k) -> unsigned { return pos + k < s.size() ? static_cast<unsigned char>(s[pos + k]) : 0u; };
  auto cont = [](unsigned b, unsigned lo = 0x80, unsigned hi = 0xbf) { return b >= lo && b <= hi; };
  if (pos >= s.size()) return 0;
  const unsigned b0 = at(0);
  if (b0 < 0x80) return 1;
  if (b0 >= 0xc2 && b0 <= 0xdf) return cont(at(1)) ? 2 : 0;
  if (b0 == 0xe0) return cont(at(1), 0xa0, 0xbf) && cont(at(2)) ? 3 : 0;
  if ((b0 >= 0xe1 && b0 <= 0xec) || b0 == 0xee || b0 == 0xef) return cont(at(1)) && cont(at(2)) ? 3 : 0;
  if (b0 == 0xed) return cont(at(1), 0x80, 0x9f) && cont(at(2)) ? 3 : 0;  // no surrogates
  if (b0 == 0xf0) return cont(at(1), 0x90, 0xbf) && cont(at(2)) && cont(at(3)) ? 4 : 0;
  if (b0 >= 0xf1 && b0 <= 0xf3) return cont(at(1)) && cont(at(2)) && cont(at(3)) ? 4 : 0;
  if (b0 == 0xf4) return cont(at(1), 0x80, 0x8f) && cont(at(2)) && cont(at(3)) ? 4 : 0;  // <= U+10FFFF
  return 0;
}

bool valid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

}  // namespace mirrored::detail
