// Fuzz target: Device::parse on arbitrary strings. Anything it accepts must print to forms that
// parse back to the same device; anything it rejects must be an InvalidArgumentError.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mirrored/device.hpp"
#include "mirrored/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using mirrored::Device;
  const std::string_view spec(reinterpret_cast<const char*>(data), size);
  Device d;
  try {
    d = Device::parse(spec);
  } catch (const mirrored::InvalidArgumentError&) {
    return 0;
  }
  if (Device::parse(d.to_string()) != d) __builtin_trap();
  if (d.job() == "localhost" && d.replica() == 0 && d.task() == 0 && Device::parse(d.short_name()) != d)
    __builtin_trap();
  return 0;
}
