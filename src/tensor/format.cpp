#include "mirrored/detail/format.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

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
  }
  return 0;
}

}  // namespace mirrored

namespace mirrored::detail {

std::string format_float(double value, bool single_precision) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // Shortest digits that round-trip at the value's own precision, as Python and numpy print.
  char buf[64];
  auto res = single_precision
                 ? std::to_chars(buf, buf + sizeof buf, static_cast<float>(value), std::chars_format::scientific)
                 : std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const auto e = sci.find('e');
  const int exponent = std::atoi(sci.c_str() + e + 1);
  if (exponent < -4 || exponent >= 16) return sci;  // Python keeps scientific form here: 1e-05, 1e+16
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
  if (frac_part.empty()) frac_part = "0";
  return sign + int_part + "." + frac_part;
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
