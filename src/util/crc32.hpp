#pragma once
// Private: CRC-32 with the polynomial and conventions of zlib's `crc32` (the checksum of checkpoint
// files), computed by carry-less-multiplication folding where the CPU has it.
#include <cstddef>
#include <cstdint>

namespace mirrored::detail {

/// The ways this build can compute a CRC-32. All give the same value as zlib's `crc32`.
enum class Crc32Kernel {
  kZlib,       ///< zlib's `crc32`: any CPU (the only kernel of a non-x86 build)
  kPclmul,     ///< PCLMULQDQ folding of 128-bit blocks (x86-64 with PCLMULQDQ)
  kVpclmul512  ///< VPCLMULQDQ folding of 512-bit blocks (x86-64 with AVX-512F and VPCLMULQDQ)
};

/// "zlib", "pclmul", "vpclmul512".
const char* crc32_kernel_name(Crc32Kernel kernel) noexcept;

/// True when this build and this CPU (checked at run time) can run `kernel`.
bool crc32_kernel_supported(Crc32Kernel kernel) noexcept;

/// The kernel `crc32_update` uses: the fastest supported one, unless `set_crc32_kernel` chose another.
Crc32Kernel crc32_kernel() noexcept;

/// Makes `crc32_update` use `kernel` from now on, process-wide (for tests and benchmarks: forcing the
/// zlib path on a CPU that has a faster one). Returns false, and changes nothing, when `kernel` is
/// not supported here.
bool set_crc32_kernel(Crc32Kernel kernel) noexcept;

/// CRC-32 of `bytes` bytes at `data`, continuing from `crc` (0 to start; the result of a previous
/// call to continue it): `crc32_update(crc32_update(0, a, n), b, m)` is the CRC of a followed by b.
/// Equal to zlib's `crc32(crc, data, bytes)` for every input. `data` needs no alignment.
std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t bytes) noexcept;

/// As `crc32_update`, with `kernel`; with zlib's when `kernel` is not supported here.
std::uint32_t crc32_update(Crc32Kernel kernel, std::uint32_t crc, const void* data, std::size_t bytes) noexcept;

}  // namespace mirrored::detail
