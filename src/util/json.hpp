#pragma once
// Private: a small, strict JSON parser (RFC 8259) for configuration read from the environment
// (TF_CONFIG). Strict where lenient parsers are silent: a duplicate key in an object is an error
// naming the key, strings must be valid UTF-8 (escapes included: no lone surrogates), numbers
// follow the grammar exactly (no leading zeros, no NaN), nothing may follow the value, and
// nesting is limited so that hostile input cannot exhaust the stack.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mirrored::detail::json {

/// One JSON value. Objects keep their members in document order (keys are unique).
class Value {
 public:
  enum class Kind { null, boolean, number, string, array, object };

  Kind kind() const noexcept { return kind_; }
  bool is_null() const noexcept { return kind_ == Kind::null; }
  bool is_bool() const noexcept { return kind_ == Kind::boolean; }
  bool is_number() const noexcept { return kind_ == Kind::number; }
  bool is_string() const noexcept { return kind_ == Kind::string; }
  bool is_array() const noexcept { return kind_ == Kind::array; }
  bool is_object() const noexcept { return kind_ == Kind::object; }

  /// The value of a boolean.
  bool as_bool() const noexcept { return boolean_; }
  /// The value of a number as a double (its exact text is `number_text()`).
  double as_double() const noexcept { return number_; }
  /// The number's text as written (for exact integer conversion).
  const std::string& number_text() const noexcept { return text_; }
  /// The number as an int64 when it is written as an integer (no fraction or exponent) that
  /// fits; nullopt otherwise.
  std::optional<int64_t> as_int64() const noexcept;
  /// The (decoded, UTF-8) string.
  const std::string& as_string() const noexcept { return text_; }
  const std::vector<Value>& items() const noexcept { return items_; }
  const std::vector<std::pair<std::string, Value>>& members() const noexcept { return members_; }
  /// The member named `key` of an object, or nullptr (also for non-objects).
  const Value* find(std::string_view key) const noexcept;

  /// "null", "boolean", "number", "string", "array" or "object" (for messages).
  static const char* kind_name(Kind kind) noexcept;
  const char* kind_name() const noexcept { return kind_name(kind_); }

 private:
  friend class Parser;
  Kind kind_ = Kind::null;
  bool boolean_ = false;
  double number_ = 0;
  std::string text_;  // string value, or a number's text
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
};

/// Default nesting limit (arrays and objects).
inline constexpr int kDefaultMaxDepth = 64;

/// Parses `text` as one JSON document. `what` names the document in messages (e.g.
/// "TF_CONFIG"). \throws InvalidArgumentError "<what> is not valid JSON: <reason> at line L,
/// column C", naming the key and the object it is in for a duplicate key.
Value parse(std::string_view text, std::string_view what = "JSON", int max_depth = kDefaultMaxDepth);

/// Appends `s` to `out` as a quoted JSON string: `"` and `\\` escaped, control characters as
/// short escapes or `\\u00XX`, and bytes that are not valid UTF-8 as U+FFFD (the written JSON is
/// always valid; text already valid UTF-8 is copied unchanged).
void append_json_string(std::string& out, std::string_view s);

}  // namespace mirrored::detail::json
