// Fuzz target: the checkpoint header parser alone (the JSON subset of a safetensors header).
// Anything it rejects must be an InvalidArgumentError; what it accepts must be self-consistent.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "mirrored/errors.hpp"
#include "variables/checkpoint_header.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace internal = mirrored::checkpoint::internal;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  internal::Header h;
  try {
    h = internal::parse_header(text, "fuzz.safetensors");
  } catch (const mirrored::InvalidArgumentError&) {
    return 0;
  }
  std::set<std::string> names;
  for (const auto& t : h.tensors) {
    if (!names.insert(t.name).second || t.name == internal::kMetadataKey) __builtin_trap();
    if (!internal::valid_utf8(t.name)) __builtin_trap();
    for (int64_t d : t.shape)
      if (d < 0) __builtin_trap();
  }
  for (const auto& [key, value] : h.metadata)
    if (!internal::valid_utf8(key) || !internal::valid_utf8(value)) __builtin_trap();
  return 0;
}
