#include "mirrored/detail/format.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <ostream>

#include "mirrored/distributed_values.hpp"
#include "mirrored/dtype.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/repr.hpp"

namespace mirrored {

const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::uint8: return "uint8";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::int32: return 4;
    case DType::int64: return 8;
    case DType::uint8: return 1;
    case DType::float16: return 2;
    case DType::bfloat16: return 2;
  }
  return 0;
}

}  // namespace mirrored

namespace mirrored::detail {

namespace {

// Python's layout of shortest scientific digits `sci` ("-1.5e+02"): positional from 1e-4 up to
// 10^upper_exponent (1e16 for Python's floats, 1e3 for numpy's float16), scientific outside.
std::string layout_like_python(std::string sci, int upper_exponent = 16) {
  const auto e = sci.find('e');
  const int exponent = std::atoi(sci.c_str() + e + 1);
  if (exponent < -4 || exponent >= upper_exponent) return sci;  // Python keeps scientific form here: 1e-05, 1e+16
  std::string mantissa = sci.substr(0, e);
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string int_part, frac_part;
  if (exponent >= 0) {
    if (static_cast<int>(digits.size()) <= exponent + 1) {
      int_part = digits + std::string(exponent + 1 - digits.size(), '0');
    } else {
      int_part = digits.substr(0, exponent + 1);
      frac_part = digits.substr(exponent + 1);
    }
  } else {
    int_part = "0";
    frac_part = std::string(-exponent - 1, '0') + digits;
  }
  // push_back, not `= "0"`: g++ 12 -O2 flags that assignment with a false -Wrestrict.
  if (frac_part.empty()) frac_part.push_back('0');
  return sign + int_part + "." + frac_part;
}

}  // namespace

std::string format_float(double value, bool single_precision) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // Shortest digits that round-trip at the value's own precision, as Python and numpy print.
  char buf[64];
  auto res = single_precision
                 ? std::to_chars(buf, buf + sizeof buf, static_cast<float>(value), std::chars_format::scientific)
                 : std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  return layout_like_python(std::string(buf, res.ptr));
}

std::string format_half(float value, bool bfloat16) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  const auto bits = [&](float f) {
    return bfloat16 ? detail::float_to_bfloat16_bits(f) : detail::float_to_half_bits(f);
  };
  const std::uint16_t want = bits(value);
  // The fewest significant digits that read back (correctly rounded to float, then to the 16-bit
  // type: innocuous double rounding) as the same value. Nine digits always suffice for a float.
  char buf[64];
  std::to_chars_result res{};
  for (int digits = 1; digits <= 9; ++digits) {
    res = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific, digits - 1);
    float back = 0;
    std::from_chars(buf, res.ptr, back, std::chars_format::scientific);
    if (bits(back) == want) break;
  }
  // numpy prints float16 scalars from 1e3 up in scientific form (`np.float16(2048)` is
  // `2.048e+03`); bfloat16 has float's range and prints as float32 does.
  return layout_like_python(std::string(buf, res.ptr), bfloat16 ? 16 : 3);
}

std::string format_shape(const Shape& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  if (shape.size() == 1) out += ",";
  return out + ")";
}

std::optional<int64_t> checked_numel(const Shape& shape, std::size_t element_size) noexcept {
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (element_size == 0 || element_size > kMax) return std::nullopt;
  // The product of the non-zero dimensions, times the element size, bounded by kMax at every step.
  uint64_t bound = element_size;
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      empty = true;
      continue;
    }
    const auto ud = static_cast<uint64_t>(d);
    if (bound > kMax / ud) return std::nullopt;
    bound *= ud;
  }
  return empty ? 0 : static_cast<int64_t>(bound / element_size);
}

int64_t shape_numel(const Shape& shape, std::size_t element_size) {
  for (int64_t d : shape)
    MIRRORED_ENFORCE(d >= 0, InvalidArgumentError, "shape ", format_shape(shape), " has a negative dimension");
  const std::optional<int64_t> n = checked_numel(shape, element_size);
  MIRRORED_ENFORCE(n.has_value(), InvalidArgumentError, "shape ", format_shape(shape),
                   " is too large: its element count or its size in bytes (elements of ", element_size,
                   " bytes) overflows int64");
  return *n;
}

std::string join_distributed(const char* name, const std::vector<std::string>& items) {
  std::string out = std::string(name) + ":{\n";
  for (std::size_t r = 0; r < items.size(); ++r) {
    std::string item = items[r];
    // Continuation lines of a multi-line component stay inside the braces.
    for (std::size_t pos = item.find('\n'); pos != std::string::npos; pos = item.find('\n', pos + 3))
      item.replace(pos, 1, "\n  ");
    out += "  " + std::to_string(r) + ": " + item;
    out += r + 1 < items.size() ? ",\n" : "\n";
  }
  return out + "}";
}

std::ostream& write_text(std::ostream& os, const std::string& text) { return os << text; }

std::ostream& print_distributed(std::ostream& os, const char* name, const std::vector<std::string>& items) {
  return os << join_distributed(name, items);
}

std::string join_repr(const std::vector<std::string>& parts, const char* open, const char* close) {
  std::size_t total = 0;
  bool multiline = false;
  for (const auto& p : parts) {
    total += p.size() + 2;
    multiline |= p.find('\n') != std::string::npos;
  }
  const std::string o(open);
  const bool one_line = !multiline && total + o.size() <= 80;
  std::string out = o;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) out += one_line ? ", " : ",\n" + std::string(o.size(), ' ');
    out += parts[i];
  }
  return out + close;
}

}  // namespace mirrored::detail
