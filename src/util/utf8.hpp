#pragma once
// UTF-8, as the library's two text formats need it: checkpoint headers and TF_CONFIG (JSON).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mirrored::detail {

/// Length of the well-formed UTF-8 sequence starting at `s[pos]`, or 0 when there is none there:
/// the shortest form only, no surrogates, nothing above U+10FFFF (a truncated sequence is 0).
std::size_t utf8_sequence_length(std::string_view s, std::size_t pos) noexcept;

/// True when all of `s` is well-formed UTF-8.
bool valid_utf8(std::string_view s) noexcept;

/// Appends code point `cp` (at most U+10FFFF) encoded as UTF-8.
void append_utf8(std::string& out, std::uint32_t cp);

}  // namespace mirrored::detail
