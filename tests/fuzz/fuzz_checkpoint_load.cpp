// Fuzz target: checkpoint::load of a whole file. Input: one byte of options (bit 0: require the
// checksum), then the file's bytes. Anything rejected must be an InvalidArgumentError (the file
// exists and is readable); what loads must describe exactly the file's data section.
#include <cstddef>
#include <cstdint>

#include "memory_file.hpp"
#include "mirrored/checkpoint.hpp"
#include "mirrored/errors.hpp"

// Keeps the reads of every tensor byte (checked by ASan) from being optimised away.
volatile unsigned char g_sink;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static mirrored::fuzz::MemoryFile file;
  if (size < 1) return 0;
  const bool require_checksum = (data[0] & 1) != 0;
  const std::string& path = file.set(data + 1, size - 1);
  mirrored::checkpoint::Checkpoint ck;
  try {
    ck = mirrored::checkpoint::load(path, {.require_checksum = require_checksum});
  } catch (const mirrored::InvalidArgumentError&) {
    return 0;
  }
  // The tensors tile the data section: their bytes add up to what follows the header.
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[1 + i];
  std::uint64_t bytes = 0;
  unsigned char sum = 0;
  for (const auto& [name, t] : ck.tensors()) {
    bytes += t.bytes();
    const auto* p = static_cast<const unsigned char*>(t.data());
    for (std::size_t i = 0; i < t.bytes(); ++i) sum = static_cast<unsigned char>(sum + p[i]);  // ASan: readable
  }
  if (bytes != size - 1 - 8 - header_len) __builtin_trap();
  g_sink = sum;
  return 0;
}
