// Checkpoint files in the safetensors format (see include/mirrored/checkpoint.hpp for the layout).

#include "mirrored/checkpoint.hpp"

#include "util/atomic_file.hpp"
#include "util/crc32.hpp"
#include "util/files.hpp"
#include "util/timeline.hpp"
#include "variables/checkpoint_header.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>

#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/format.hpp"

static_assert(std::endian::native == std::endian::little,
              "checkpoint files hold little-endian data; big-endian hosts are not supported");

namespace mirrored {
namespace detail {
namespace {

std::atomic<CheckpointFaultHook> g_fault_hook{nullptr};

}  // namespace

std::uint32_t checkpoint_crc32(std::uint32_t crc, const void* data, std::size_t bytes) noexcept {
  return crc32_update(crc, data, bytes);
}

CheckpointFaultHook set_checkpoint_fault_hook(CheckpointFaultHook hook) noexcept { return g_fault_hook.exchange(hook); }

std::string checkpoint_temp_prefix(const std::string& path) { return AtomicFileWriter::temp_prefix(path); }
std::string checkpoint_lock_path(const std::string& path) { return AtomicFileWriter::lock_path(path); }

}  // namespace detail

namespace checkpoint {
namespace {

using namespace internal;

using detail::str_cat;

/// The safetensors reader (Rust) refuses headers larger than this; so do we.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kChecksumPrefix = "crc32:";
/// Host tensors up to this size are gathered into one write with their neighbours.
constexpr std::size_t kGatherBytes = std::size_t{64} << 10;
/// Loading reads and checksums the data in pieces of this size (small enough to stay in L2).
constexpr std::size_t kCrcPieceBytes = std::size_t{256} << 10;

// --- I/O helpers -----------------------------------------------------------------------------

[[noreturn]] void throw_io(const std::string& path, const char* what, const std::string& file, int err) {
  detail::throw_file_error(prefix(path), what, file, err);
}

void write_all(int fd, const void* data, std::size_t bytes, const std::string& path, const std::string& file) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io(path, "writing", file, errno);
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

/// Reads exactly `bytes` at the current position; returns how many were read (fewer at EOF).
std::size_t read_full(int fd, void* data, std::size_t bytes, const std::string& path) {
  auto* p = static_cast<char*>(data);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::read(fd, p + done, bytes - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io(path, "reading", path, errno);
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

/// Bytes of a tensor of `dtype` and `shape`, or nullopt when the shape is too large to be a
/// tensor (the rule of `detail::checked_numel`, so that what passes here can be allocated).
std::optional<std::uint64_t> byte_size(DType dtype, const Shape& shape) {
  const std::optional<int64_t> n = detail::checked_numel(shape, dtype_size(dtype));
  if (!n) return std::nullopt;
  return static_cast<std::uint64_t>(*n) * dtype_size(dtype);
}

std::string hex8(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

std::optional<std::uint32_t> parse_checksum(std::string_view s) {
  if (s.size() != kChecksumPrefix.size() + 8 || s.substr(0, kChecksumPrefix.size()) != kChecksumPrefix)
    return std::nullopt;
  std::uint32_t v = 0;
  for (char c : s.substr(kChecksumPrefix.size())) {
    unsigned d;
    if (c >= '0' && c <= '9')
      d = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f')
      d = static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      d = static_cast<unsigned>(c - 'A' + 10);
    else
      return std::nullopt;
    v = (v << 4) | d;
  }
  return v;
}

void call_fault_hook(const std::string& temp, std::uint64_t written, std::uint64_t total) {
  if (auto hook = detail::g_fault_hook.load()) hook(temp, written, total);
}

void check_name(const std::string& path, std::string_view kind, const std::string& name) {
  MIRRORED_ENFORCE(valid_utf8(name), InvalidArgumentError, prefix(path), kind, " ", quoted(name),
                   " is not valid UTF-8");
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) noexcept {
  for (const auto& e : kDtypes)
    if (e.dtype == dtype) return e.name;
  return "?";
}

void save_tensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata) {
  internal::save_tensors_with(path, tensors, metadata, {});
}

void internal::save_tensors_with(const std::string& path, const TensorMap& tensors, const Metadata& metadata,
                                 const Metadata& library_metadata, bool sync_directory, bool caller_holds_lock,
                                 const std::string& reuse) {
  detail::timeline::Scope trace("checkpoint_save", "checkpoint");
  if (trace.active()) {
    trace.arg("tensors", static_cast<std::int64_t>(tensors.size()));
    trace.path(path);
  }
  // --- validate the arguments and lay out the file before touching the file system ---
  MIRRORED_ENFORCE(!path.empty(), InvalidArgumentError, "checkpoint::save_tensors: empty path");
  for (const auto& [key, value] : metadata) {
    check_name(path, "metadata key", key);
    MIRRORED_ENFORCE(valid_utf8(value), InvalidArgumentError, prefix(path), "metadata value of key ", quoted(key),
                     " is not valid UTF-8");
    MIRRORED_ENFORCE(key.rfind("mirrored.", 0) != 0, InvalidArgumentError, prefix(path), "metadata key ", quoted(key),
                     " is reserved (keys starting with 'mirrored.' are the library's)");
  }
  std::uint64_t data_bytes = 0;
  std::string header = "{\"__metadata__\":{";
  Metadata all_metadata = metadata;
  for (const auto& [key, value] : library_metadata) {
    MIRRORED_ENFORCE(key.rfind("mirrored.", 0) == 0 && key != kChecksumKey && key != kFormatKey, InvalidArgumentError,
                     prefix(path), "library metadata key ", quoted(key), " is not one of the library's own");
    all_metadata[key] = value;
  }
  all_metadata[kChecksumKey] = std::string(kChecksumPrefix) + "00000000";  // patched after the data
  all_metadata[kFormatKey] = kFormatVersion;
  bool first = true;
  std::size_t checksum_pos = std::string::npos;
  for (const auto& [key, value] : all_metadata) {
    if (!first) header += ',';
    first = false;
    append_json_string(header, key);
    header += ':';
    if (key == kChecksumKey) checksum_pos = header.size() + 1 + kChecksumPrefix.size();
    append_json_string(header, value);
  }
  header += '}';
  for (const auto& [name, t] : tensors) {
    MIRRORED_ENFORCE(name != kMetadataKey, InvalidArgumentError, prefix(path),
                     "'__metadata__' cannot be a tensor name");
    check_name(path, "tensor name", name);
    MIRRORED_ENFORCE(t.numel == 0 || t.storage, InvalidArgumentError, prefix(path), "tensor ", quoted(name),
                     " has no storage");
    const std::uint64_t bytes = t.bytes();
    header += ",";
    append_json_string(header, name);
    header += str_cat(":{\"dtype\":\"", safetensors_dtype_name(t.dtype), "\",\"shape\":[");
    for (std::size_t i = 0; i < t.shape.size(); ++i) header += str_cat(i ? "," : "", t.shape[i]);
    header += str_cat("],\"data_offsets\":[", data_bytes, ",", data_bytes + bytes, "]}");
    data_bytes += bytes;
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');
  MIRRORED_ENFORCE(header.size() <= kMaxHeaderBytes, InvalidArgumentError, prefix(path), "header of ", header.size(),
                   " bytes exceeds the safetensors limit of ", kMaxHeaderBytes, " bytes");
  const std::uint64_t total = 8 + header.size() + data_bytes;
  trace.arg("bytes", static_cast<std::int64_t>(total));  // the file's size

  // --- write a fresh temporary file, fsync, rename over <path>, fsync the directory ---
  detail::AtomicFileWriter file =
      caller_holds_lock && !reuse.empty()
          ? detail::AtomicFileWriter(path, prefix(path), reuse)
          : detail::AtomicFileWriter(path, prefix(path),
                                     caller_holds_lock ? detail::AtomicFileWriter::Locking::held_by_caller
                                                       : detail::AtomicFileWriter::Locking::own_lock);
  const int fd = file.fd();
  const std::string& temp = file.temp_path();
  {
    // Small pieces (the length, the header, small host tensors) are gathered into one buffer and
    // written together: a model of many small tensors costs a few writes, not one per tensor.
    std::vector<unsigned char> pending;
    std::uint64_t written = 0;
    const auto flush = [&] {
      if (pending.empty()) return;
      write_all(fd, pending.data(), pending.size(), path, temp);
      written += pending.size();
      pending.clear();
      call_fault_hook(temp, written, total);
    };
    const auto gather = [&](const void* p, std::size_t bytes) {
      if (pending.size() + bytes > detail::kCheckpointChunkBytes) flush();
      if (pending.capacity() == 0)
        pending.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(total, detail::kCheckpointChunkBytes)));
      const auto* b = static_cast<const unsigned char*>(p);
      pending.insert(pending.end(), b, b + bytes);
    };
    unsigned char len[8];
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    gather(len, 8);
    gather(header.data(), header.size());

    std::uint32_t crc = 0;
    std::vector<unsigned char> staging;  // device tensors pass through it, a chunk at a time
    for (const auto& [name, t] : tensors) {
      const std::size_t bytes = t.bytes();
      if (bytes == 0) continue;
      auto& backend = t.storage->backend();
      backend.synchronize();
      const auto* src = static_cast<const unsigned char*>(t.data());
      // Host memory is checksummed and written where it is: copying it into staging first cost
      // about 4 % of a 64 MiB save (more than the checksum now does). Only small tensors are
      // gathered (a copy that saves a system call).
      const bool on_host = t.device().is_host();
      if (on_host && bytes <= kGatherBytes) {
        crc = detail::crc32_update(crc, src, bytes);
        gather(src, bytes);
        continue;
      }
      flush();
      if (!on_host && staging.empty())
        staging.resize(static_cast<std::size_t>(std::min<std::uint64_t>(data_bytes, detail::kCheckpointChunkBytes)));
      for (std::size_t off = 0; off < bytes; off += detail::kCheckpointChunkBytes) {
        const std::size_t chunk = std::min(detail::kCheckpointChunkBytes, bytes - off);
        const unsigned char* out = src + off;
        if (!on_host) {
          backend.copy_to_host(staging.data(), src + off, chunk);
          out = staging.data();
        }
        crc = detail::crc32_update(crc, out, chunk);
        write_all(fd, out, chunk, path, temp);
        written += chunk;
        call_fault_hook(temp, written, total);
      }
    }
    flush();
    const std::string hex = hex8(crc);
    const auto at = static_cast<off_t>(8 + checksum_pos);
    errno = 0;
    if (::pwrite(fd, hex.data(), hex.size(), at) != static_cast<ssize_t>(hex.size()))
      throw_io(path, "writing", temp, errno ? errno : EIO);
  }
  file.commit(true, sync_directory);  // on any error before this, `file` removes the temporary file
}

Checkpoint load(const std::string& path, const LoadOptions& options) {
  detail::timeline::Scope trace("checkpoint_load", "checkpoint");
  if (trace.active()) trace.path(path);
  // Never blocks in open (a FIFO), and only a regular file is read.
  const detail::ReadableFile fd = detail::open_regular_file(path, prefix(path));
  const std::uint64_t file_size = fd.size();
  trace.arg("bytes", static_cast<std::int64_t>(file_size));

  // --- header ---
  unsigned char len[8];
  MIRRORED_ENFORCE(file_size >= 8 && read_full(fd.fd(), len, 8, path) == 8, InvalidArgumentError, prefix(path),
                   "truncated: the file has ", file_size, " bytes, too few for the 8-byte header length");
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len[i];
  MIRRORED_ENFORCE(header_len <= kMaxHeaderBytes, InvalidArgumentError, prefix(path), "corrupt: header length ",
                   header_len, " exceeds the safetensors limit of ", kMaxHeaderBytes, " bytes");
  MIRRORED_ENFORCE(8 + header_len <= file_size, InvalidArgumentError, prefix(path), "truncated: header length ",
                   header_len, " needs ", 8 + header_len, " bytes, the file has ", file_size);
  std::string text(static_cast<std::size_t>(header_len), '\0');
  MIRRORED_ENFORCE(read_full(fd.fd(), text.data(), text.size(), path) == text.size(), InvalidArgumentError,
                   prefix(path), "truncated while reading the header (the file changed?)");
  Header header = parse_header(text, path);
  const std::uint64_t data_size = file_size - 8 - header_len;

  // --- metadata ---
  std::optional<std::uint32_t> expected_crc;
  if (auto it = header.metadata.find(kChecksumKey); it != header.metadata.end()) {
    expected_crc = parse_checksum(it->second);
    MIRRORED_ENFORCE(expected_crc.has_value(), InvalidArgumentError, prefix(path), "corrupt: ", kChecksumKey, " is ",
                     quoted(it->second), ", expected 'crc32:' and 8 hex digits");
  } else {
    MIRRORED_ENFORCE(!options.require_checksum, InvalidArgumentError, prefix(path), "no '", kChecksumKey,
                     "' in __metadata__ (not written by mirrored, or a corrupt header); load it with "
                     "LoadOptions::require_checksum = false to skip the check");
  }
  if (auto it = header.metadata.find(kFormatKey); it != header.metadata.end())
    MIRRORED_ENFORCE(it->second == kFormatVersion, InvalidArgumentError, prefix(path), "unsupported ", kFormatKey, " ",
                     quoted(it->second), " (this build reads version ", kFormatVersion, ")");

  // --- offsets: every tensor's size matches its dtype and shape; together they tile the data
  // section exactly, in offset order, without gaps or overlaps (the safetensors rule) ---
  for (const TensorInfo& t : header.tensors) {
    const auto bytes = byte_size(t.dtype, t.shape);
    MIRRORED_ENFORCE(bytes.has_value(), InvalidArgumentError, prefix(path), "corrupt: tensor ", quoted(t.name),
                     ": shape ", detail::format_shape(t.shape),
                     " is too large (its element count or size in bytes overflows int64)");
    MIRRORED_ENFORCE(t.begin <= t.end, InvalidArgumentError, prefix(path), "corrupt: tensor ", quoted(t.name),
                     ": data_offsets [", t.begin, ", ", t.end, "] are reversed");
    MIRRORED_ENFORCE(t.end - t.begin == *bytes, InvalidArgumentError, prefix(path), "corrupt: tensor ", quoted(t.name),
                     ": data_offsets [", t.begin, ", ", t.end, "] span ", t.end - t.begin, " bytes, but ",
                     safetensors_dtype_name(t.dtype), " shape ", detail::format_shape(t.shape), " needs ", *bytes);
  }
  std::vector<const TensorInfo*> order;
  for (const TensorInfo& t : header.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  std::uint64_t expected_begin = 0;
  for (const TensorInfo* t : order) {
    MIRRORED_ENFORCE(
        t->begin == expected_begin, InvalidArgumentError, prefix(path), "corrupt: tensor ", quoted(t->name),
        ": data_offsets [", t->begin, ", ", t->end, "] ",
        t->begin < expected_begin ? "overlap the previous tensor" : "leave a gap after the previous tensor",
        " (expected it to start at ", expected_begin, ")");
    MIRRORED_ENFORCE(t->end <= data_size, InvalidArgumentError, prefix(path), "truncated: tensor ", quoted(t->name),
                     " needs data bytes [", t->begin, ", ", t->end, "), the file has only ", data_size,
                     " bytes of data");
    expected_begin = t->end;
  }
  MIRRORED_ENFORCE(expected_begin == data_size, InvalidArgumentError, prefix(path),
                   "corrupt: ", data_size - expected_begin,
                   " bytes after the last tensor's data (the header describes ", expected_begin,
                   " bytes of data, the file has ", data_size, ")");

  // --- data, in file order, with the checksum ---
  TensorMap tensors;
  std::uint32_t crc = 0;
  for (const TensorInfo* t : order) {
    detail::UntypedTensor u = detail::make_untyped(t->dtype, t->shape, cpu0);
    const std::size_t bytes = u.bytes();
    auto* dst = static_cast<unsigned char*>(u.data());
    // Checksummed piece by piece right after each read, while the piece is still in cache.
    for (std::size_t off = 0; off < bytes; off += kCrcPieceBytes) {
      const std::size_t piece = std::min(kCrcPieceBytes, bytes - off);
      MIRRORED_ENFORCE(read_full(fd.fd(), dst + off, piece, path) == piece, InvalidArgumentError, prefix(path),
                       "truncated while reading tensor ", quoted(t->name), " (the file changed?)");
      crc = detail::checkpoint_crc32(crc, dst + off, piece);
    }
    tensors.emplace(t->name, std::move(u));
  }
  if (expected_crc) {
    MIRRORED_ENFORCE(crc == *expected_crc, InvalidArgumentError, prefix(path),
                     "corrupt: checksum mismatch: the data section's crc32 is ", hex8(crc), ", the header records ",
                     hex8(*expected_crc));
  }
  return Checkpoint(path, std::move(tensors), std::move(header.metadata));
}

TensorMap load_tensors(const std::string& path, const LoadOptions& options) { return load(path, options).tensors(); }

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

const detail::UntypedTensor& Checkpoint::at(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::string have;
    std::size_t listed = 0;
    for (const auto& [n, t] : tensors_) {
      if (listed == 20) {
        have += str_cat(", ... (", tensors_.size(), " in all)");
        break;
      }
      have += str_cat(listed ? ", " : "", quoted(n));
      ++listed;
    }
    throw NotFoundError(str_cat(prefix(path_), "no tensor named ", quoted(name), " (the file has ",
                                tensors_.empty() ? std::string("no tensors") : have, ")"));
  }
  return it->second;
}

void Checkpoint::check(const std::string& name, DType dtype, const Shape& shape) const {
  const detail::UntypedTensor& u = at(name);
  if (u.dtype != dtype) throw_dtype_mismatch(name, u.dtype, dtype);
  MIRRORED_ENFORCE(u.shape == shape, InvalidArgumentError, prefix(path_), "tensor ", quoted(name),
                   ": shape mismatch: the file has ", detail::format_shape(u.shape), ", expected ",
                   detail::format_shape(shape));
}

void Checkpoint::throw_dtype_mismatch(const std::string& name, DType have, DType want) const {
  throw InvalidArgumentError(str_cat(prefix(path_), "tensor ", quoted(name), ": dtype mismatch: the file has ",
                                     dtype_name(have), ", expected ", dtype_name(want)));
}

}  // namespace checkpoint
}  // namespace mirrored
