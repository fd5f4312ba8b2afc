#include "collectives/nest_structure.hpp"

#include <cstddef>
#include <vector>

#include "mirrored/errors.hpp"

namespace mirrored::detail {
namespace {

// One node of a decoded structure.
struct Node {
  char kind = '.';                // '.' leaf, '[' vector, '(' tuple, '{' map
  std::vector<std::string> keys;  // a map's keys, in order
  std::vector<Node> children;
};

// Decodes the node that starts at s[i] (the grammar is in flatten's comment), advancing i.
Node parse(std::string_view s, std::size_t& i) {
  auto bad = [&] { return InternalError(str_cat("malformed nest structure encoding at offset ", i, ": ", s)); };
  if (i >= s.size()) throw bad();
  Node node;
  node.kind = s[i++];
  if (node.kind == '.') return node;
  const char close = node.kind == '[' ? ']' : node.kind == '(' ? ')' : node.kind == '{' ? '}' : '\0';
  if (close == '\0') throw bad();
  while (i < s.size() && s[i] != close) {
    if (node.kind == '{') {
      std::size_t len = 0, digits = 0;
      for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, ++digits)
        len = len * 10 + static_cast<std::size_t>(s[i] - '0');
      if (digits == 0 || i >= s.size() || s[i] != ':' || s.size() - i - 1 < len) throw bad();
      node.keys.emplace_back(s.substr(i + 1, len));
      i += 1 + len;
    }
    node.children.push_back(parse(s, i));
  }
  if (i >= s.size()) throw bad();
  ++i;
  return node;
}

std::string quoted(const std::string& key) {
  std::string out = "\"";
  for (char c : key) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string elements(std::size_t n) { return str_cat(n, n == 1 ? " element" : " elements"); }

std::string describe(const Node& n) {
  switch (n.kind) {
    case '[': return "a vector of " + elements(n.children.size());
    case '(': return "a tuple of " + elements(n.children.size());
    case '{': {
      constexpr std::size_t kMaxKeys = 16;  // a message, not a dump
      std::string out = "keys {";
      for (std::size_t k = 0; k < n.keys.size() && k < kMaxKeys; ++k) out += (k ? ", " : "") + quoted(n.keys[k]);
      if (n.keys.size() > kMaxKeys) out += str_cat(", ... (", n.keys.size(), " keys)");
      return out + "}";
    }
    default: return "a tensor or number";
  }
}

// Finds the first place where a and b differ (depth first); fills what each has there and the path.
bool first_difference(const Node& a, const Node& b, std::string& path, std::string& da, std::string& db) {
  if (a.kind != b.kind || a.children.size() != b.children.size() || a.keys != b.keys) {
    da = describe(a);
    db = describe(b);
    return true;
  }
  for (std::size_t c = 0; c < a.children.size(); ++c) {
    const std::size_t len = path.size();
    // str_cat for both: g++ 12 at -O2 warns (-Wrestrict, a false positive) on `"[" + std::string&&`.
    path += a.kind == '{' ? str_cat("[", quoted(a.keys[c]), "]") : str_cat("[", c, "]");
    if (first_difference(a.children[c], b.children[c], path, da, db)) return true;
    path.resize(len);
  }
  return false;
}

Node parse_all(std::string_view s) {
  std::size_t i = 0;
  Node n = parse(s, i);
  if (i != s.size()) throw InternalError(str_cat("malformed nest structure encoding (trailing data): ", s));
  return n;
}

}  // namespace

std::string structure_mismatch(const char* op, int replica_a, std::string_view a, int replica_b, std::string_view b) {
  std::string path, da, db;
  if (!first_difference(parse_all(a), parse_all(b), path, da, db)) {
    throw InternalError(str_cat(op, ": nest structures reported as different are equal: ", a));
  }
  return str_cat(op, ": replica ", replica_a, " passed ", da, " but replica ", replica_b, " passed ", db,
                 path.empty() ? "" : " at " + path, " (nests must have the same structure on every replica)");
}

}  // namespace mirrored::detail
