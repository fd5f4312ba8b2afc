// Fuzz target: text_line_dataset over one file. The lines read must be exactly the file split at
// "\n", each without a final "\r", with no empty last line after a final "\n".
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "memory_file.hpp"
#include "mirrored/data/files.hpp"
#include "mirrored/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static mirrored::fuzz::MemoryFile file;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> expected;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    expected.push_back(line);
    start = end + 1;
  }
  const std::string& path = file.set(data, size);
  std::size_t i = 0;
  for (const auto& line : mirrored::data::text_line_dataset({path})) {
    if (i >= expected.size() || mirrored::data::to_string(line) != expected[i]) __builtin_trap();
    ++i;
  }
  if (i != expected.size()) __builtin_trap();
  return 0;
}
