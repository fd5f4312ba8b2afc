// Fuzz target: fixed_length_record_dataset over one file. Input: three bytes choosing the record,
// header and footer sizes (small values and values near INT64_MAX), then the file's bytes. Anything
// rejected must be an InvalidArgumentError naming the file; what is read must be exactly the body.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "memory_file.hpp"
#include "mirrored/data/files.hpp"
#include "mirrored/errors.hpp"

namespace {

int64_t size_from(std::uint8_t b, std::size_t file_size) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  switch (b % 8) {
    case 0: return 0;
    case 1: return b % 5;
    case 2: return b % 64;
    case 3: return static_cast<int64_t>(file_size);
    case 4: return static_cast<int64_t>(file_size) + 1;
    case 5: return kMax;
    case 6: return kMax - b;
    default: return int64_t{1} << (b % 63);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static mirrored::fuzz::MemoryFile file;
  if (size < 3) return 0;
  const std::size_t file_size = size - 3;
  const int64_t record = 1 + data[0] % 16;
  const int64_t header = size_from(data[1], file_size);
  const int64_t footer = size_from(data[2], file_size);
  const std::uint8_t* body = data + 3;
  const std::string& path = file.set(body, file_size);
  std::size_t at = static_cast<std::size_t>(header);
  try {
    for (const auto& r : mirrored::data::fixed_length_record_dataset({path}, record, header, footer)) {
      if (r.numel() != record || at + static_cast<std::size_t>(record) > file_size) __builtin_trap();
      if (std::memcmp(r.data(), body + at, static_cast<std::size_t>(record)) != 0) __builtin_trap();
      at += static_cast<std::size_t>(record);
    }
  } catch (const mirrored::InvalidArgumentError& e) {
    if (std::string(e.what()).find(path) == std::string::npos) __builtin_trap();
    return 0;
  }
  // Everything between the header and the footer was read.
  if (at + static_cast<std::size_t>(footer) != file_size) __builtin_trap();
  return 0;
}
