#pragma once
/// \file
/// `repr`: the printed form of values the library hands back (tensors, numbers, nests), as Python
/// prints them.

#include <iosfwd>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "mirrored/detail/format.hpp"
#include "mirrored/device.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail {

template <class X>
concept Streamable = requires(std::ostream& os, const X& x) {
  os << x;
};

/// Writes `text` to `os` (compiled: a printing operator's caller needs no <ostream>).
std::ostream& write_text(std::ostream& os, const std::string& text);

/// Joins element reprs Python-style: on one line when short, else one element per line.
std::string join_repr(const std::vector<std::string>& parts, const char* open, const char* close);

}  // namespace mirrored::detail

namespace mirrored {

/// Printed form of a value: tensors and distributed values as `operator<<` prints them, numbers
/// like Python (`1.0`, `2`), `std::vector` as a list, `std::tuple` as a tuple, `std::map` as a dict.
template <class X>
std::string repr(const X& x) {
  if constexpr (std::is_arithmetic_v<X>) {
    return detail::format_element(x);
  } else if constexpr (std::is_convertible_v<const X&, std::string_view>) {
    return "'" + std::string(std::string_view(x)) + "'";
  } else if constexpr (requires {
                         x.begin();
                         x.end();
                         typename X::key_type;
                         typename X::mapped_type;
                       }) {
    std::vector<std::string> parts;
    for (const auto& [k, v] : x) parts.push_back(repr(k) + ": " + repr(v));
    return detail::join_repr(parts, "{", "}");
  } else if constexpr (requires {
                         x.begin();
                         x.end();
                         typename X::value_type;
                       }) {
    std::vector<std::string> parts;
    for (const auto& v : x) parts.push_back(repr(v));
    return detail::join_repr(parts, "[", "]");
  } else if constexpr (requires { std::tuple_size<X>::value; }) {
    std::vector<std::string> parts;
    std::apply([&](const auto&... e) { (parts.push_back(repr(e)), ...); }, x);
    return detail::join_repr(parts, "(", std::tuple_size_v<X> == 1 ? ",)" : ")");
  } else {
    static_assert(detail::Streamable<X>, "repr: type has no printed form");
    detail::MessageBuilder os;  // a std::ostringstream in the compiled library
    os.stream() << x;
    return os.str();
  }
}

}  // namespace mirrored
