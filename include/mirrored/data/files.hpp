#pragma once
/// \file
/// File sources: fixed-length binary records (TF's `FixedLengthRecordDataset`) and text lines
/// (TF's `TextLineDataset`) over a list of files. Both read lazily, one file after the other,
/// and are what `AutoShardPolicy::FILE` shards across input workers.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mirrored/data/dataset.hpp"

namespace mirrored::data {

namespace detail {

/// Layout of a fixed-length record file: `header_bytes`, then records of `record_bytes`, then
/// `footer_bytes`.
struct RecordFormat {
  int64_t record_bytes = 0;
  int64_t header_bytes = 0;
  int64_t footer_bytes = 0;
};

/// Cursors over this worker's files (compiled in src/data/files.cpp).
std::unique_ptr<Cursor<Tensor<uint8_t>>> open_record_files(const std::vector<std::string>& files,
                                                           const RecordFormat& format, const OpenContext& ctx);
std::unique_ptr<Cursor<Tensor<uint8_t>>> open_line_files(const std::vector<std::string>& files, const OpenContext& ctx);
/// Cursors positioned by saved state: the file being read and the position in it (records
/// read, or the byte offset of the next line). \throws InvalidArgumentError for corrupt state or
/// a file now too short for the saved position; what opening the file throws.
std::unique_ptr<Cursor<Tensor<uint8_t>>> restore_record_files(const std::vector<std::string>& files,
                                                              const RecordFormat& format, const OpenContext& ctx,
                                                              StateReader& r);
std::unique_ptr<Cursor<Tensor<uint8_t>>> restore_line_files(const std::vector<std::string>& files,
                                                            const OpenContext& ctx, StateReader& r);
/// The source as iterator state describes it: kind, format, and the file names (hashed).
std::string describe_files(const std::vector<std::string>& files, bool lines, const RecordFormat& format);

/// A source reading a list of files; `lines` picks text lines, else fixed-length records.
class FileNode final : public Node<Tensor<uint8_t>> {
 public:
  FileNode(std::vector<std::string> files, bool lines, RecordFormat format)
      : Node({TensorSpec{{lines ? -1 : format.record_bytes}, DType::uint8}}, info_for(files)),
        files_(std::move(files)),
        lines_(lines),
        format_(format) {}

  std::unique_ptr<Cursor<Tensor<uint8_t>>> open(const OpenContext& ctx) const override {
    return lines_ ? open_line_files(files_, ctx) : open_record_files(files_, format_, ctx);
  }
  std::unique_ptr<Cursor<Tensor<uint8_t>>> restore(const OpenContext& ctx, StateReader& r) const override {
    return lines_ ? restore_line_files(files_, ctx, r) : restore_record_files(files_, format_, ctx, r);
  }
  std::string describe() const override { return describe_files(files_, lines_, format_); }

 private:
  static GraphInfo info_for(const std::vector<std::string>& files) {
    GraphInfo info;
    info.num_files = files.size();
    return info;
  }
  std::vector<std::string> files_;
  bool lines_;
  RecordFormat format_;
};

}  // namespace detail

/// The records of `filenames`, in order: each file holds `header_bytes`, then records of
/// `record_bytes` bytes, then `footer_bytes`; every record is a `uint8` tensor of shape
/// `(record_bytes,)`. Files are opened when the iteration reaches them.
/// \throws InvalidArgumentError (here) when `filenames` is empty, `record_bytes <= 0` or a
/// header/footer size is negative; from the iterator, naming the file: NotFoundError for a
/// missing file, PermissionDeniedError for one that may not be read, InvalidArgumentError for a
/// directory or anything else that is not a regular file (a FIFO is refused without blocking), a
/// file shorter than its header and footer, or one whose body is not a whole number of records;
/// for a read error, the error its errno calls for (UnavailableError for EIO) with the errno text.
inline Dataset<Tensor<uint8_t>> fixed_length_record_dataset(std::vector<std::string> filenames, int64_t record_bytes,
                                                            int64_t header_bytes = 0, int64_t footer_bytes = 0) {
  MIRRORED_ENFORCE(!filenames.empty(), InvalidArgumentError, "fixed_length_record_dataset: no filenames given");
  MIRRORED_ENFORCE(record_bytes > 0, InvalidArgumentError,
                   "fixed_length_record_dataset: record_bytes must be greater than zero (got ", record_bytes, ")");
  MIRRORED_ENFORCE(header_bytes >= 0 && footer_bytes >= 0, InvalidArgumentError,
                   "fixed_length_record_dataset: header_bytes and footer_bytes must be >= 0 (got ", header_bytes,
                   " and ", footer_bytes, ")");
  return Dataset<Tensor<uint8_t>>(std::make_shared<detail::FileNode>(
      std::move(filenames), false, detail::RecordFormat{record_bytes, header_bytes, footer_bytes}));
}

/// The lines of `filenames`, in order, without their line terminator ("\n" or "\r\n"); each line
/// is a `uint8` tensor of shape `(length,)` (use `to_string` to read it as text). Files are opened
/// when the iteration reaches them.
/// \throws InvalidArgumentError (here) when `filenames` is empty; from the iterator, naming the
/// file: NotFoundError, PermissionDeniedError, InvalidArgumentError (not a regular file) as
/// `fixed_length_record_dataset`, and for a read error the error its errno calls for
/// (UnavailableError for EIO) with the errno text — never a silent end of the data.
inline Dataset<Tensor<uint8_t>> text_line_dataset(std::vector<std::string> filenames) {
  MIRRORED_ENFORCE(!filenames.empty(), InvalidArgumentError, "text_line_dataset: no filenames given");
  return Dataset<Tensor<uint8_t>>(
      std::make_shared<detail::FileNode>(std::move(filenames), true, detail::RecordFormat{}));
}

/// The bytes of a `uint8` tensor (e.g. a line of `text_line_dataset`) as a string.
std::string to_string(const Tensor<uint8_t>& bytes);

}  // namespace mirrored::data
