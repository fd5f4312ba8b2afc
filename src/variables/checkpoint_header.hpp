#pragma once
// Private: the JSON header of checkpoint files (see checkpoint_header.cpp).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mirrored/checkpoint.hpp"
#include "util/utf8.hpp"

#include "util/json.hpp"

namespace mirrored::checkpoint::internal {

inline constexpr std::string_view kMetadataKey = "__metadata__";

struct DtypeEntry {
  DType dtype;
  const char* name;
};
inline constexpr DtypeEntry kDtypes[] = {
    {DType::float32, "F32"}, {DType::float64, "F64"}, {DType::int32, "I32"},     {DType::int64, "I64"},
    {DType::uint8, "U8"},    {DType::float16, "F16"}, {DType::bfloat16, "BF16"},
};

/// `checkpoint 'path': ` — the prefix of every message.
std::string prefix(const std::string& path);
/// A name as it appears in messages: quoted, with control characters escaped.
std::string quoted(std::string_view s);
/// The dtype with safetensors name `name` ("F32", …), if supported.
std::optional<DType> dtype_from_name(std::string_view name);
using detail::append_utf8;  // util/utf8.hpp
using detail::valid_utf8;
using detail::json::append_json_string;  // util/json.hpp (names are checked UTF-8 before)

struct TensorInfo {
  std::string name;
  DType dtype = DType::float32;
  Shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

struct Header {
  std::vector<TensorInfo> tensors;
  Metadata metadata;
};

/// `save_tensors(path, tensors, metadata)` that also stores `library_metadata`, whose keys are
/// the library's own (`mirrored.` and more, e.g. `mirrored.manager.step`; not the checksum or the
/// format). `sync_directory` false skips the directory's fsync after the rename (the file itself
/// is always fsynced before it: the caller syncs the directory, or accepts that a machine crash may
/// undo the rename). `caller_holds_lock`: the caller holds a lock that excludes every other writer
/// of `path` and has removed the temporary files of crashed saves (no lock file of its own);
/// with it, a non-empty `reuse` names a file of the caller's that is no longer needed, written
/// over instead of a new temporary file (see `detail::AtomicFileWriter`).
/// \throws what `save_tensors` throws; InvalidArgumentError for another library key.
void save_tensors_with(const std::string& path, const TensorMap& tensors, const Metadata& metadata,
                       const Metadata& library_metadata, bool sync_directory = true, bool caller_holds_lock = false,
                       const std::string& reuse = {});

/// Parses a header. \throws InvalidArgumentError naming `path` for anything that is not a valid
/// safetensors header.
Header parse_header(std::string_view text, const std::string& path);

}  // namespace mirrored::checkpoint::internal
