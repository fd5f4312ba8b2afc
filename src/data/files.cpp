// File sources of the input pipeline: fixed-length binary records and text lines over a list
// of files, read sequentially one file at a time (files are opened only when reached).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/data/files.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::data::detail {
namespace {

using Bytes = Tensor<uint8_t>;

struct FileCloser {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File open_file(const std::string& path, const char* what) {
  std::error_code ec;
  MIRRORED_ENFORCE(std::filesystem::exists(path, ec) && !std::filesystem::is_directory(path, ec), NotFoundError, what,
                   ": ", path, "; No such file or directory");
  File f(std::fopen(path.c_str(), "rb"));
  MIRRORED_ENFORCE(f != nullptr, NotFoundError, what, ": cannot open ", path, ": ", std::strerror(errno));
  std::setvbuf(f.get(), nullptr, _IOFBF, 1 << 16);
  return f;
}

// The files of `all` this worker reads (FILE sharding: file i goes to worker i % num_workers).
std::vector<std::string> my_files(const std::vector<std::string>& all, const OpenContext& ctx) {
  if (!ctx.shard_files || ctx.num_workers <= 1) return all;
  std::vector<std::string> mine;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (static_cast<int>(i % static_cast<std::size_t>(ctx.num_workers)) == ctx.worker_index) mine.push_back(all[i]);
  return mine;
}

class RecordCursor final : public Cursor<Bytes> {
 public:
  RecordCursor(std::vector<std::string> files, RecordFormat format) : files_(std::move(files)), format_(format) {}

  std::optional<Bytes> next() override {
    while (true) {
      if (!file_ && !open_next()) return std::nullopt;
      if (remaining_ > 0) {
        Bytes record = Bytes::empty({format_.record_bytes});
        const auto n = static_cast<std::size_t>(format_.record_bytes);
        MIRRORED_ENFORCE(std::fread(record.data(), 1, n, file_.get()) == n, InvalidArgumentError,
                         "fixed_length_record_dataset: short read in ", files_[index_ - 1],
                         " (file changed while read?)");
        --remaining_;
        return record;
      }
      file_.reset();
    }
  }

 private:
  bool open_next() {
    if (index_ >= files_.size()) return false;
    const std::string& path = files_[index_++];
    file_ = open_file(path, "fixed_length_record_dataset");
    std::error_code ec;
    const auto size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
    MIRRORED_ENFORCE(!ec, NotFoundError, "fixed_length_record_dataset: cannot stat ", path, ": ", ec.message());
    const int64_t body = size - format_.header_bytes - format_.footer_bytes;
    MIRRORED_ENFORCE(body >= 0 && body % format_.record_bytes == 0, InvalidArgumentError,
                     "fixed_length_record_dataset: Excluding the header (", format_.header_bytes,
                     " bytes) and footer (", format_.footer_bytes, " bytes), input file \"", path,
                     "\" has body length ", body, " bytes, which is not an exact multiple of the record length (",
                     format_.record_bytes, " bytes).");
    remaining_ = body / format_.record_bytes;
    if (format_.header_bytes) std::fseek(file_.get(), static_cast<long>(format_.header_bytes), SEEK_SET);
    return true;
  }

  std::vector<std::string> files_;
  RecordFormat format_;
  std::size_t index_ = 0;
  File file_;
  int64_t remaining_ = 0;
};

class LineCursor final : public Cursor<Bytes> {
 public:
  explicit LineCursor(std::vector<std::string> files) : files_(std::move(files)) {}

  std::optional<Bytes> next() override {
    while (true) {
      if (!file_) {
        if (index_ >= files_.size()) return std::nullopt;
        file_ = open_file(files_[index_++], "text_line_dataset");
      }
      if (read_line()) {
        Bytes out = Bytes::empty({static_cast<int64_t>(line_.size())});
        if (!line_.empty()) std::memcpy(out.data(), line_.data(), line_.size());
        return out;
      }
      file_.reset();
    }
  }

 private:
  // Reads one line without its "\n" or "\r\n"; false at the end of the file.
  bool read_line() {
    line_.clear();
    int c;
    bool any = false;
    while ((c = std::getc(file_.get())) != EOF) {
      any = true;
      if (c == '\n') break;
      line_.push_back(static_cast<char>(c));
    }
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    return any;
  }

  std::vector<std::string> files_;
  std::size_t index_ = 0;
  File file_;
  std::string line_;
};

}  // namespace

std::unique_ptr<Cursor<Tensor<uint8_t>>> open_record_files(const std::vector<std::string>& files,
                                                           const RecordFormat& format, const OpenContext& ctx) {
  return std::make_unique<RecordCursor>(my_files(files, ctx), format);
}

std::unique_ptr<Cursor<Tensor<uint8_t>>> open_line_files(const std::vector<std::string>& files,
                                                         const OpenContext& ctx) {
  return std::make_unique<LineCursor>(my_files(files, ctx));
}

}  // namespace mirrored::data::detail

namespace mirrored::data {

std::string to_string(const Tensor<uint8_t>& bytes) {
  const std::vector<uint8_t> host = bytes.to_vector();
  return std::string(host.begin(), host.end());
}

}  // namespace mirrored::data
