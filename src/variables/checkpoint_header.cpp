// The JSON header of checkpoint files: names in messages, and reading exactly what a safetensors
// header may hold from util/json's strict parse of it.
#include "variables/checkpoint_header.hpp"

#include <cstdio>
#include <limits>

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
namespace {

using detail::json::Value;

/// Reads exactly what a safetensors header may hold from its parsed JSON (util/json: strict
/// RFC 8259, duplicate keys, invalid UTF-8 and lone surrogates already refused): one object whose
/// members are `__metadata__` (an object of strings) and tensors ({"dtype": string, "shape":
/// [uint...], "data_offsets": [uint, uint]}). Anything else is a corrupt header.
class HeaderReader {
 public:
  explicit HeaderReader(const std::string& path) : path_(path) {}

  Header read(const Value& root) {
    Header h;
    if (!root.is_object()) fail(str_cat("expected the header to be an object, found ", root.kind_name()));
    for (const auto& [key, value] : root.members()) {
      if (key == kMetadataKey)
        h.metadata = read_metadata(value);
      else
        h.tensors.push_back(read_tensor(key, value));
    }
    if (!unsupported_.empty())
      throw InvalidArgumentError(
          str_cat(prefix(path_), unsupported_, " (mirrored holds F32, F64, I32, I64, U8, F16, BF16)"));
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgumentError(str_cat(prefix(path_), "corrupt header: ", what));
  }

  std::uint64_t read_uint(const Value& v, const std::string& who, const char* what) const {
    if (!v.is_number()) fail(str_cat(who, ": expected a non-negative integer for ", what, ", found ", v.kind_name()));
    const std::string& text = v.number_text();  // the grammar's: no leading zeros, no '+'
    if (text[0] == '-') fail(str_cat(who, ": expected a non-negative integer for ", what, ", found ", text));
    std::uint64_t out = 0;
    for (char c : text) {
      if (c < '0' || c > '9') fail(str_cat(who, ": ", what, " ", text, " is not an integer"));
      const auto d = static_cast<std::uint64_t>(c - '0');
      if (out > (std::numeric_limits<std::uint64_t>::max() - d) / 10) fail(str_cat(who, ": ", what, " is too large"));
      out = out * 10 + d;
    }
    return out;
  }

  std::vector<std::uint64_t> read_uints(const Value& v, const std::string& who, const char* what) const {
    if (!v.is_array()) fail(str_cat(who, ": expected an array of ", what, "s, found ", v.kind_name()));
    std::vector<std::uint64_t> out;
    for (const Value& item : v.items()) out.push_back(read_uint(item, who, what));
    return out;
  }

  Metadata read_metadata(const Value& v) const {
    if (!v.is_object()) fail(str_cat("__metadata__ is not an object but ", v.kind_name()));
    Metadata m;
    for (const auto& [key, value] : v.members()) {
      if (!value.is_string()) fail(str_cat("__metadata__ value of ", quoted(key), " is not a string"));
      m.emplace(key, value.as_string());  // keys are unique: the parser refused duplicates
    }
    return m;
  }

  TensorInfo read_tensor(const std::string& name, const Value& v) {
    TensorInfo info;
    info.name = name;
    const std::string who = str_cat("tensor ", quoted(name));
    if (!v.is_object()) fail(str_cat(who, ": expected an object, found ", v.kind_name()));
    const Value* dtype = nullptr;
    const Value* shape = nullptr;
    const Value* offsets = nullptr;
    for (const auto& [key, value] : v.members()) {
      if (key == "dtype")
        dtype = &value;
      else if (key == "shape")
        shape = &value;
      else if (key == "data_offsets")
        offsets = &value;
      else
        fail(str_cat(who, ": unexpected key ", quoted(key)));
    }
    if (!dtype) fail(str_cat(who, ": missing \"dtype\""));
    if (!shape) fail(str_cat(who, ": missing \"shape\""));
    if (!offsets) fail(str_cat(who, ": missing \"data_offsets\""));

    if (!dtype->is_string()) fail(str_cat(who, ": \"dtype\" is not a string but ", dtype->kind_name()));
    // A dtype mirrored cannot hold (F8_E4M3, C64, ...) does not make the header corrupt: it is
    // reported once the whole header has been read (a broken one is reported as such).
    if (const auto dt = dtype_from_name(dtype->as_string()))
      info.dtype = *dt;
    else if (unsupported_.empty())
      unsupported_ = str_cat(who, " has unsupported dtype ", quoted(dtype->as_string()));
    for (std::uint64_t d : read_uints(*shape, who, "shape dimension")) {
      if (d > static_cast<std::uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(str_cat(who, ": shape dimension ", d, " is too large"));
      info.shape.push_back(static_cast<int64_t>(d));
    }
    const auto offs = read_uints(*offsets, who, "data offset");
    if (offs.size() != 2) fail(str_cat(who, ": data_offsets has ", offs.size(), " entries, expected 2"));
    info.begin = offs[0];
    info.end = offs[1];
    return info;
  }

  const std::string& path_;
  std::string unsupported_;  // the first tensor with a dtype mirrored cannot hold, and that dtype
};

}  // namespace

Header parse_header(std::string_view text, const std::string& path) {
  // Said before the JSON is parsed: a header that is some other JSON value, or none, is reported
  // as what it is rather than as the first syntax error inside it.
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || text[first] != '{')
    throw InvalidArgumentError(
        str_cat(prefix(path), "corrupt header: expected the header to start with '{', found ",
                first == std::string_view::npos ? std::string("nothing") : quoted(text.substr(first, 1))));
  const Value root = detail::json::parse(text, str_cat(prefix(path), "corrupt header: the header"));
  return HeaderReader(path).read(root);
}

}  // namespace mirrored::checkpoint::internal
