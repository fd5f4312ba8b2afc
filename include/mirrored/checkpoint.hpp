#pragma once
/// \file
/// Checkpoint files: a named set of tensors saved to one file in the safetensors format
/// (https://github.com/huggingface/safetensors), readable by Python's `safetensors` package.
///
/// Layout of a file:
///
///     [8 bytes]  N, the header length, unsigned little-endian
///     [N bytes]  JSON header, padded with spaces to a multiple of 8:
///                {"__metadata__":{"mirrored.checksum":"crc32:1a2b3c4d","mirrored.format":"1",...},
///                 "<name>":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},...}
///     [rest]     the data section: every tensor's raw little-endian row-major bytes, one after
///                the other in name order (byte-wise `std::string` order), no gaps.
///
/// dtypes: F32 (float32), F64 (float64), I32 (int32), I64 (int64), U8 (uint8), F16 (float16),
/// BF16 (bfloat16), all stored bit-exact. `data_offsets` are relative to the start of the data
/// section. `mirrored.checksum` is the CRC-32 (zlib's `crc32`, the ISO-HDLC polynomial) of the
/// whole data section, 8 lower-case hex digits.
///
/// Saving writes a new temporary file `<path>.tmp.<random>` (created with `O_CREAT | O_EXCL |
/// O_NOFOLLOW`, so a planted file or symlink is never written through), fsyncs it, renames it over
/// `<path>` and fsyncs the directory: a crash at any point leaves either the previous file or the
/// new one, never a mix. Saves to one path hold `<path>.lock` (a `flock`; removed when the save
/// ends) and first remove the temporary files of crashed saves. Loading never blocks on a FIFO,
/// reads only regular files, and validates the whole file (header syntax, dtypes, shapes, offsets,
/// sizes, checksum) before returning anything.
///
/// Errors (all name the file, and the tensor where there is one):
/// - `NotFoundError`: the file (or its directory) does not exist; a requested tensor is absent.
/// - `InvalidArgumentError`: a truncated or corrupt file (bad header, bad offsets, a shape too
///   large to be a tensor, checksum mismatch); a dtype that safetensors has but mirrored cannot
///   hold (F8_E4M3, C64, ...: "tensor '<name>' has unsupported dtype '<dtype>'", not a corrupt
///   header); something that is not a regular file (a directory, a FIFO, a device; a symlink in
///   place of the lock file); a dtype or shape that differs from what the caller expects; a bad
///   name or metadata key passed to `save_tensors`.
/// - `PermissionDeniedError`: the file or its directory may not be read or written (EACCES).
/// - `FailedPreconditionError`: another save to the same path is in progress; a read-only or
///   full file system. `UnavailableError`: other I/O errors (EIO).

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/dtype.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored::checkpoint {

/// Tensors by name (type-erased, so one map holds every dtype).
using TensorMap = std::map<std::string, detail::UntypedTensor>;
/// The safetensors `__metadata__` map (string to string).
using Metadata = std::map<std::string, std::string>;

/// Metadata keys the library writes (and reserves: callers may not pass keys starting
/// with `mirrored.`).
inline constexpr const char* kChecksumKey = "mirrored.checksum";
inline constexpr const char* kFormatKey = "mirrored.format";
inline constexpr const char* kFormatVersion = "1";

/// The safetensors name of a dtype: `F32 F64 I32 I64 U8 F16 BF16`.
const char* safetensors_dtype_name(DType dtype) noexcept;

/// The type-erased handle of a typed tensor (shares its storage), for building a `TensorMap`.
template <class T>
detail::UntypedTensor untyped(const Tensor<T>& t) {
  return detail::TensorAccess::erase(t);
}

/// Saves `tensors` (on any device) to `path`, atomically replacing any existing file. `metadata` is
/// stored in `__metadata__` next to the library's own keys.
/// \throws InvalidArgumentError for the name `__metadata__` or a metadata key starting with
/// `mirrored.`; the I/O errors listed in the file comment. On any error the previous file at `path`
/// is unchanged and no temporary file is left behind.
void save_tensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata = {});

/// Options of `load`.
struct LoadOptions {
  /// Require and verify `mirrored.checksum` (true). False accepts safetensors files written by
  /// other tools, which carry no checksum (one that is present is still verified).
  bool require_checksum = true;
};

/// A fully loaded and validated checkpoint: host (`CPU:0`) tensors and the metadata.
class Checkpoint {
 public:
  Checkpoint() = default;
  Checkpoint(std::string path, TensorMap tensors, Metadata metadata)
      : path_(std::move(path)), tensors_(std::move(tensors)), metadata_(std::move(metadata)) {}

  /// The file it was loaded from (used in error messages).
  const std::string& path() const noexcept { return path_; }
  /// Every tensor, by name.
  const TensorMap& tensors() const noexcept { return tensors_; }
  /// The whole `__metadata__` map, the library's `mirrored.*` keys included.
  const Metadata& metadata() const noexcept { return metadata_; }
  /// Tensor names in file order (sorted).
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

  /// The tensor `name`. \throws NotFoundError naming the file and the tensor (and listing the
  /// names the file has) when absent.
  const detail::UntypedTensor& at(const std::string& name) const;
  /// Checks that `name` exists with `dtype` and `shape`, without returning it (validate every
  /// tensor first, then assign: a restore that fails changes nothing).
  /// \throws NotFoundError when absent; InvalidArgumentError on a dtype or shape mismatch, naming
  /// the file, the tensor, and both dtypes or shapes.
  void check(const std::string& name, DType dtype, const Shape& shape) const;

  /// The tensor `name` as a `Tensor<T>` (shares the checkpoint's storage; clone it to modify).
  /// \throws NotFoundError when absent; InvalidArgumentError when its dtype is not `T`'s.
  template <class T>
  Tensor<T> get(const std::string& name) const {
    const detail::UntypedTensor& u = at(name);
    if (u.dtype != dtype_of<T>()) throw_dtype_mismatch(name, u.dtype, dtype_of<T>());
    return detail::TensorAccess::restore<T>(u);
  }
  /// As `get<T>(name)`, also requiring `shape`. \throws InvalidArgumentError on a mismatch.
  template <class T>
  Tensor<T> get(const std::string& name, const Shape& shape) const {
    check(name, dtype_of<T>(), shape);
    return detail::TensorAccess::restore<T>(at(name));
  }

 private:
  [[noreturn]] void throw_dtype_mismatch(const std::string& name, DType have, DType want) const;

  std::string path_;
  TensorMap tensors_;
  Metadata metadata_;
};

/// Loads and validates the whole file at `path`.
/// \throws NotFoundError when the file does not exist; InvalidArgumentError when it is truncated or
/// corrupt (the message names the file, the tensor where one is involved, and what is wrong) or is
/// not a regular file (a directory, a FIFO: refused without blocking); PermissionDeniedError when
/// it may not be read.
Checkpoint load(const std::string& path, const LoadOptions& options = {});

/// `load(path).tensors()`.
TensorMap load_tensors(const std::string& path, const LoadOptions& options = {});

}  // namespace mirrored::checkpoint

// Internals and test hooks (in mirrored::detail, so that `detail::` inside mirrored::checkpoint
// still means mirrored::detail).
namespace mirrored::detail {

/// CRC-32 (the polynomial and conventions of zlib's `crc32`): continues from `crc` (0 to start).
std::uint32_t checkpoint_crc32(std::uint32_t crc, const void* data, std::size_t bytes) noexcept;

/// Test hook called while `checkpoint::save_tensors` writes the temporary file: after each write
/// (at most `kCheckpointChunkBytes`; the header and small tensors are gathered into one), with the bytes
/// written so far and the file's total size. It may throw (the save then fails cleanly: the
/// temporary file is removed) or `_exit` (a simulated crash: the temporary file stays behind).
using CheckpointFaultHook = void (*)(const std::string& temp_path, std::uint64_t bytes_written,
                                     std::uint64_t total_bytes);
/// Installs `hook` (nullptr removes it); returns the previous one. Process-wide; for tests only.
CheckpointFaultHook set_checkpoint_fault_hook(CheckpointFaultHook hook) noexcept;
/// Largest single write of tensor data.
inline constexpr std::size_t kCheckpointChunkBytes = std::size_t{1} << 20;

/// The name every temporary file of `checkpoint::save_tensors(path, ...)` starts with,
/// `<path>.tmp.` (a random suffix follows). A crash mid-save can leave one behind; the next save
/// to `path` removes it.
std::string checkpoint_temp_prefix(const std::string& path);
/// The lock file of saves to `path`, `<path>.lock`: present while a save runs, and after a crashed
/// one until the next save to `path`.
std::string checkpoint_lock_path(const std::string& path);

}  // namespace mirrored::detail
