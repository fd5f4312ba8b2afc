#include "util/json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "mirrored/errors.hpp"
#include "util/utf8.hpp"

namespace mirrored::detail::json {

const char* Value::kind_name(Kind kind) noexcept {
  switch (kind) {
    case Kind::null: return "null";
    case Kind::boolean: return "boolean";
    case Kind::number: return "number";
    case Kind::string: return "string";
    case Kind::array: return "array";
    case Kind::object: return "object";
  }
  return "value";
}

std::optional<int64_t> Value::as_int64() const noexcept {
  if (kind_ != Kind::number) return std::nullopt;
  int64_t v = 0;
  const char* end = text_.data() + text_.size();
  auto [ptr, ec] = std::from_chars(text_.data(), end, v);
  if (ec != std::errc() || ptr != end) return std::nullopt;  // a fraction, an exponent, or too large
  return v;
}

const Value* Value::find(std::string_view key) const noexcept {
  for (const auto& [k, v] : members_)
    if (k == key) return &v;
  return nullptr;
}

namespace {

// A key or string as it may appear in a message: printable ASCII as is, the rest escaped, and
// long strings cut (the input may be hostile).
std::string printable(std::string_view s) {
  std::string out;
  constexpr std::size_t kMax = 80;
  for (std::size_t i = 0; i < s.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > kMax) out += "...";
  return out;
}

}  // namespace

class Parser {
 public:
  Parser(std::string_view text, std::string_view what, int max_depth) : s_(text), what_(what), max_depth_(max_depth) {}

  Value parse_document() {
    skip_ws();
    if (pos_ == s_.size()) fail("the document is empty");
    Value v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& reason) const { fail_at(pos_, reason); }
  [[noreturn]] void fail_at(std::size_t at, const std::string& reason) const {
    int line = 1, column = 1;
    for (std::size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw InvalidArgumentError(str_cat(what_, " is not valid JSON: ", reason, " at line ", line, ", column ", column));
  }

  std::string where() const {
    if (path_.empty()) return "the top-level object";
    std::string p;
    for (const auto& k : path_) p += k;
    return "the object at " + p;
  }

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  bool consume(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Value parse_value(int depth) {
    if (pos_ == s_.size()) fail("unexpected end of input, expected a value");
    Value v;
    const char c = s_[pos_];
    if (c == '{' || c == '[') {
      if (depth >= max_depth_) fail(str_cat("nesting deeper than ", max_depth_, " levels"));
      return c == '{' ? parse_object(depth + 1) : parse_array(depth + 1);
    }
    if (c == '"') {
      v.kind_ = Value::Kind::string;
      v.text_ = parse_string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    if (consume("true")) {
      v.kind_ = Value::Kind::boolean;
      v.boolean_ = true;
      return v;
    }
    if (consume("false")) {
      v.kind_ = Value::Kind::boolean;
      return v;
    }
    if (consume("null")) return v;
    fail(str_cat("unexpected character '", printable(s_.substr(pos_, 1)), "'"));
  }

  Value parse_object(int depth) {
    Value v;
    v.kind_ = Value::Kind::object;
    ++pos_;  // '{'
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_ws();
      if (pos_ == s_.size() || s_[pos_] != '"') fail("expected a string key");
      const std::size_t key_at = pos_;
      std::string key = parse_string();
      for (const auto& member : v.members_) {
        if (member.first == key) fail_at(key_at, str_cat("duplicate key \"", printable(key), "\" in ", where()));
      }
      skip_ws();
      if (pos_ == s_.size() || s_[pos_] != ':') fail(str_cat("expected ':' after key \"", printable(key), "\""));
      ++pos_;
      skip_ws();
      path_.push_back(path_.empty() ? printable(key)
                                    : str_cat(".", printable(key)));  // not "." + s: g++ 12 -O2 warns (-Wrestrict)
      Value member = parse_value(depth);
      path_.pop_back();
      v.members_.emplace_back(std::move(key), std::move(member));
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return v;
      }
      fail("expected ',' or '}' in an object");
    }
  }

  Value parse_array(int depth) {
    Value v;
    v.kind_ = Value::Kind::array;
    ++pos_;  // '['
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_ws();
      path_.push_back(str_cat("[", v.items_.size(), "]"));
      v.items_.push_back(parse_value(depth));
      path_.pop_back();
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return v;
      }
      fail("expected ',' or ']' in an array");
    }
  }

  Value parse_number() {
    const std::size_t start = pos_;
    auto digit = [&] { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
    if (s_[pos_] == '-') ++pos_;
    if (!digit()) fail("expected a digit");
    if (s_[pos_] == '0') {
      ++pos_;
      if (digit()) fail_at(start, "a number may not have leading zeros");
    } else {
      while (digit()) ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digit()) fail("expected a digit after the decimal point");
      while (digit()) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digit()) fail("expected a digit in the exponent");
      while (digit()) ++pos_;
    }
    Value v;
    v.kind_ = Value::Kind::number;
    v.text_ = std::string(s_.substr(start, pos_ - start));
    const char* first = v.text_.data();
    const char* last = first + v.text_.size();
    auto [ptr, ec] = std::from_chars(first, last, v.number_);
    if (ec != std::errc() || ptr != last || !std::isfinite(v.number_))
      fail_at(start, str_cat("number ", printable(v.text_), " is out of range"));
    return v;
  }

  unsigned hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      u <<= 4;
      if (c >= '0' && c <= '9')
        u |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        u |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        u |= static_cast<unsigned>(c - 'A' + 10);
      else
        fail("bad hex digit in a \\u escape");
    }
    return u;
  }

  std::string parse_string() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (pos_ == s_.size()) fail("unterminated string");
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("a control character in a string must be escaped");
      if (c == '\\') {
        ++pos_;
        if (pos_ == s_.size()) fail("unterminated escape");
        const char e = s_[pos_++];
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
            unsigned cp = hex4();
            if (cp >= 0xdc00 && cp <= 0xdfff) fail("a lone low surrogate in a \\u escape");
            if (cp >= 0xd800 && cp <= 0xdbff) {
              if (!consume("\\u")) fail("a high surrogate not followed by a low surrogate");
              const unsigned lo = hex4();
              if (lo < 0xdc00 || lo > 0xdfff) fail("a high surrogate not followed by a low surrogate");
              cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            append_utf8(out, cp);
            break;
          }
          default: fail(str_cat("unknown escape '\\", printable(std::string_view(&e, 1)), "'"));
        }
        continue;
      }
      const std::size_t n = utf8_sequence_length(s_, pos_);
      if (n == 0) fail("invalid UTF-8 in a string");
      out.append(s_.substr(pos_, n));
      pos_ += n;
    }
  }

  std::string_view s_;
  std::string_view what_;
  int max_depth_;
  std::size_t pos_ = 0;
  std::vector<std::string> path_;
};

Value parse(std::string_view text, std::string_view what, int max_depth) {
  return Parser(text, what, max_depth).parse_document();
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    // Printable ASCII other than the two escaped characters goes out as one piece (the timeline
    // writes every name and key through here).
    std::size_t plain = i;
    while (plain < s.size()) {
      const auto p = static_cast<unsigned char>(s[plain]);
      if (p < 0x20 || p >= 0x80 || p == '"' || p == '\\') break;
      ++plain;
    }
    if (plain > i) {
      out.append(s.data() + i, plain - i);
      i = plain;
      continue;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const std::size_t len = utf8_sequence_length(s, i);
      if (len == 0) {
        append_utf8(out, 0xFFFD);
        ++i;
      } else {
        out.append(s.substr(i, len));
        i += len;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  out += '"';
}

}  // namespace mirrored::detail::json
