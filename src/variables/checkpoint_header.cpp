// The JSON header of checkpoint files: string escaping both ways and a strict parser for exactly
// what a safetensors header may hold.
#include "variables/checkpoint_header.hpp"

#include <cstdio>
#include <limits>
#include <set>

namespace mirrored::checkpoint::internal {

using detail::str_cat;

std::string prefix(const std::string& path) { return str_cat("checkpoint '", path, "': "); }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& e : kDtypes)
    if (name == e.name) return e.dtype;
  return std::nullopt;
}

/// A name as it appears in messages: quoted, with control characters escaped.
std::string quoted(std::string_view s) {
  std::string out = "'";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "'";
}
// --- JSON (the subset a safetensors header uses) --------------------------------------------


/// What the header says about one tensor.

/// A strict parser for exactly what a safetensors header may hold: one object whose members are
/// `__metadata__` (an object of strings) and tensors ({"dtype": string, "shape": [uint...],
/// "data_offsets": [uint, uint]}). Anything else is a corrupt header.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  Header parse() {
    Header h;
    std::set<std::string> seen;
    bool have_metadata = false;
    skip_ws();
    expect('{', "the header to start with '{'");
    skip_ws();
    if (!consume('}')) {
      for (;;) {
        skip_ws();
        std::string key = parse_string();
        skip_ws();
        expect(':', "':' after a key");
        skip_ws();
        if (key == kMetadataKey) {
          if (have_metadata) fail(str_cat("duplicate key ", quoted(key)));
          have_metadata = true;
          h.metadata = parse_metadata();
        } else {
          if (!seen.insert(key).second) fail(str_cat("duplicate tensor name ", quoted(key)));
          h.tensors.push_back(parse_tensor(std::move(key)));
        }
        skip_ws();
        if (consume(',')) continue;
        expect('}', "',' or '}' after a member");
        break;
      }
    }
    skip_ws();
    if (pos_ != text_.size()) fail("unexpected data after the header object");
    if (!unsupported_.empty())
      throw InvalidArgumentError(
          str_cat(prefix(path_), unsupported_, " (mirrored holds F32, F64, I32, I64, U8, F16, BF16)"));
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgumentError(
        str_cat(prefix(path_), "corrupt header (byte ", pos_, " of ", text_.size(), "): ", what));
  }

  void skip_ws() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r' || text_[pos_] == '\t'))
      ++pos_;
  }
  bool consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c, const char* what) {
    if (!consume(c)) {
      if (pos_ >= text_.size()) fail(str_cat("expected ", what, ", found the end of the header"));
      fail(str_cat("expected ", what, ", found ", quoted(text_.substr(pos_, 1))));
    }
  }

  unsigned hex_digit() {
    if (pos_ >= text_.size()) fail("unterminated \\u escape");
    const char c = text_[pos_++];
    if (c >= '0' && c <= '9') return static_cast<unsigned>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<unsigned>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<unsigned>(c - 'A' + 10);
    fail("bad hex digit in a \\u escape");
  }
  std::uint32_t parse_u4() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 4) | hex_digit();
    return v;
  }

  std::string parse_string() {
    expect('"', "a string");
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated string");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = parse_u4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!(consume('\\') && consume('u'))) fail("unpaired surrogate in a \\u escape");
            const std::uint32_t lo = parse_u4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired surrogate in a \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(str_cat("bad escape \\", quoted(std::string_view(&e, 1))));
      }
    }
    if (!valid_utf8(out)) fail("a string is not valid UTF-8");
    return out;
  }

  std::uint64_t parse_uint(const char* what) {
    const std::size_t start = pos_;
    std::uint64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const auto d = static_cast<std::uint64_t>(text_[pos_] - '0');
      if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) fail(str_cat(what, " is too large"));
      v = v * 10 + d;
      ++pos_;
    }
    if (pos_ == start) fail(str_cat("expected a non-negative integer for ", what));
    if (pos_ - start > 1 && text_[start] == '0') fail(str_cat(what, " has a leading zero"));
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
      fail(str_cat(what, " is not an integer"));
    return v;
  }

  /// `[uint, uint, ...]`
  std::vector<std::uint64_t> parse_uint_array(const char* what) {
    std::vector<std::uint64_t> out;
    expect('[', "'[' to start an array");
    skip_ws();
    if (consume(']')) return out;
    for (;;) {
      skip_ws();
      out.push_back(parse_uint(what));
      skip_ws();
      if (consume(',')) continue;
      expect(']', "',' or ']' in an array");
      return out;
    }
  }

  Metadata parse_metadata() {
    Metadata m;
    expect('{', "'{' to start __metadata__");
    skip_ws();
    if (consume('}')) return m;
    for (;;) {
      skip_ws();
      std::string key = parse_string();
      skip_ws();
      expect(':', "':' after a key");
      skip_ws();
      if (pos_ < text_.size() && text_[pos_] != '"')
        fail(str_cat("__metadata__ value of ", quoted(key), " is not a string"));
      std::string value = parse_string();
      if (!m.emplace(key, std::move(value)).second) fail(str_cat("duplicate __metadata__ key ", quoted(key)));
      skip_ws();
      if (consume(',')) continue;
      expect('}', "',' or '}' in __metadata__");
      return m;
    }
  }

  TensorInfo parse_tensor(std::string name) {
    TensorInfo info;
    info.name = std::move(name);
    const std::string who = str_cat("tensor ", quoted(info.name));
    bool have_dtype = false, have_shape = false, have_offsets = false;
    if (pos_ >= text_.size() || text_[pos_] != '{') fail(str_cat(who, ": expected an object"));
    expect('{', "'{'");
    skip_ws();
    if (!consume('}')) {
      for (;;) {
        skip_ws();
        const std::string key = parse_string();
        skip_ws();
        expect(':', "':' after a key");
        skip_ws();
        if (key == "dtype") {
          if (have_dtype) fail(str_cat(who, ": duplicate \"dtype\""));
          have_dtype = true;
          const std::string d = parse_string();
          const auto dt = dtype_from_name(d);
          // A dtype mirrored cannot hold (F8_E4M3, C64, ...) does not make the header corrupt: it
          // is reported once the whole header has parsed (a broken one is reported as such).
          if (dt)
            info.dtype = *dt;
          else if (unsupported_.empty())
            unsupported_ = str_cat(who, " has unsupported dtype ", quoted(d));
        } else if (key == "shape") {
          if (have_shape) fail(str_cat(who, ": duplicate \"shape\""));
          have_shape = true;
          for (std::uint64_t d : parse_uint_array("a shape dimension")) {
            if (d > static_cast<std::uint64_t>(std::numeric_limits<int64_t>::max()))
              fail(str_cat(who, ": shape dimension ", d, " is too large"));
            info.shape.push_back(static_cast<int64_t>(d));
          }
        } else if (key == "data_offsets") {
          if (have_offsets) fail(str_cat(who, ": duplicate \"data_offsets\""));
          have_offsets = true;
          const auto offs = parse_uint_array("a data offset");
          if (offs.size() != 2) fail(str_cat(who, ": data_offsets has ", offs.size(), " entries, expected 2"));
          info.begin = offs[0];
          info.end = offs[1];
        } else {
          fail(str_cat(who, ": unexpected key ", quoted(key)));
        }
        skip_ws();
        if (consume(',')) continue;
        expect('}', "',' or '}' in a tensor entry");
        break;
      }
    }
    if (!have_dtype) fail(str_cat(who, ": missing \"dtype\""));
    if (!have_shape) fail(str_cat(who, ": missing \"shape\""));
    if (!have_offsets) fail(str_cat(who, ": missing \"data_offsets\""));
    return info;
  }

  std::string_view text_;
  std::string unsupported_;  // the first tensor with a dtype mirrored cannot hold, and that dtype
  const std::string& path_;
  std::size_t pos_ = 0;
};

Header parse_header(std::string_view text, const std::string& path) { return HeaderParser(text, path).parse(); }

}  // namespace mirrored::checkpoint::internal
