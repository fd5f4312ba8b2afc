// File sources of the input pipeline: fixed-length binary records and text lines over a list
// of files, read sequentially one file at a time (files are opened only when reached).
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/data/files.hpp"
#include "mirrored/errors.hpp"
#include "util/files.hpp"
#include "util/fnv1a.hpp"

namespace mirrored::data::detail {
namespace {

using Bytes = Tensor<uint8_t>;
using ::mirrored::detail::str_cat;

struct FileCloser {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// Opens a data file without blocking on a FIFO; only regular files are accepted (see
// open_regular_file for the error types). Returns the stream and the file's size when opened.
File open_file(const std::string& path, const char* what, std::uint64_t* size = nullptr) {
  ::mirrored::detail::ReadableFile file = ::mirrored::detail::open_regular_file(path, std::string(what) + ": ");
  if (size) *size = file.size();
  File f(::fdopen(file.fd(), "rb"));
  if (!f) ::mirrored::detail::throw_file_error(std::string(what) + ": ", "opening", path, errno);
  file.release();  // the stream owns it now
  std::setvbuf(f.get(), nullptr, _IOFBF, 1 << 16);
  return f;
}

// A read that stopped early: a read error (errno, naming the file), else the file got shorter.
[[noreturn]] void throw_read_error(std::FILE* f, const char* what, const std::string& path) {
  if (std::ferror(f)) ::mirrored::detail::throw_file_error(std::string(what) + ": ", "reading", path, errno);
  throw InvalidArgumentError(str_cat(what, ": unexpected end of file in '", path, "' (the file changed while read?)"));
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
  RecordCursor(std::vector<std::string> files, RecordFormat format, std::stop_token stop)
      : files_(std::move(files)), format_(format), stop_(std::move(stop)) {}

  std::optional<Bytes> next() override {
    while (true) {
      throw_if_cancelled(stop_);  // many empty files
      if (!file_ && !open_next()) return std::nullopt;
      if (remaining_ > 0) {
        Bytes record = Bytes::empty({format_.record_bytes});
        const auto n = static_cast<std::size_t>(format_.record_bytes);
        errno = 0;
        if (std::fread(record.data(), 1, n, file_.get()) != n)
          throw_read_error(file_.get(), "fixed_length_record_dataset", files_[index_ - 1]);
        --remaining_;
        return record;
      }
      file_.reset();
    }
  }

  // State: files opened so far, whether one is open, and the records left in it.
  void save(StateWriter& w) override {
    w.u64(index_);
    w.boolean(file_ != nullptr);
    w.i64(remaining_);
  }
  void restore(StateReader& r) {
    const uint64_t index = r.u64();
    const bool open = r.boolean();
    const int64_t remaining = r.i64();
    r.check(index <= files_.size() && (!open || index >= 1), "a file index outside the file list");
    r.check(remaining >= 0 && (open || remaining == 0), "a negative record count");
    index_ = static_cast<std::size_t>(open ? index - 1 : index);
    if (!open) return;
    open_next();
    const std::string& path = files_[index_ - 1];
    MIRRORED_ENFORCE(remaining <= remaining_, InvalidArgumentError, r.op(), ": \"", path, "\" has ", remaining_,
                     " records, fewer than the ", remaining, " left to read at the saved position");
    const int64_t skip = (remaining_ - remaining) * format_.record_bytes + format_.header_bytes;
    if (::fseeko(file_.get(), static_cast<off_t>(skip), SEEK_SET) != 0)
      ::mirrored::detail::throw_file_error("fixed_length_record_dataset: ", "seeking in", path, errno);
    remaining_ = remaining;
  }

 private:
  bool open_next() {
    if (index_ >= files_.size()) return false;
    const std::string& path = files_[index_++];
    std::uint64_t size = 0;
    file_ = open_file(path, "fixed_length_record_dataset", &size);
    // Header and footer sizes are any int64 >= 0: compare before subtracting, so that sizes near
    // INT64_MAX cannot overflow.
    const auto header = static_cast<std::uint64_t>(format_.header_bytes);
    const auto footer = static_cast<std::uint64_t>(format_.footer_bytes);
    MIRRORED_ENFORCE(header <= size && footer <= size - header, InvalidArgumentError,
                     "fixed_length_record_dataset: input file \"", path, "\" has ", size,
                     " bytes, fewer than its header (", format_.header_bytes, " bytes) and footer (",
                     format_.footer_bytes, " bytes) together");
    const auto body = static_cast<int64_t>(size - header - footer);
    MIRRORED_ENFORCE(body % format_.record_bytes == 0, InvalidArgumentError,
                     "fixed_length_record_dataset: Excluding the header (", format_.header_bytes,
                     " bytes) and footer (", format_.footer_bytes, " bytes), input file \"", path,
                     "\" has body length ", body, " bytes, which is not an exact multiple of the record length (",
                     format_.record_bytes, " bytes).");
    remaining_ = body / format_.record_bytes;
    if (header && ::fseeko(file_.get(), static_cast<off_t>(header), SEEK_SET) != 0)
      ::mirrored::detail::throw_file_error("fixed_length_record_dataset: ", "seeking in", path, errno);
    return true;
  }

  std::vector<std::string> files_;
  RecordFormat format_;
  std::stop_token stop_;
  std::size_t index_ = 0;
  File file_;
  int64_t remaining_ = 0;
};

class LineCursor final : public Cursor<Bytes> {
 public:
  LineCursor(std::vector<std::string> files, std::stop_token stop) : files_(std::move(files)), stop_(std::move(stop)) {}

  std::optional<Bytes> next() override {
    while (true) {
      throw_if_cancelled(stop_);  // many empty files
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

  // State: files opened so far, whether one is open, and the offset of the next line in it.
  void save(StateWriter& w) override {
    w.u64(index_);
    w.boolean(file_ != nullptr);
    int64_t offset = 0;
    if (file_) {
      offset = static_cast<int64_t>(::ftello(file_.get()));
      if (offset < 0)
        ::mirrored::detail::throw_file_error("text_line_dataset: ", "telling the offset in", files_[index_ - 1], errno);
    }
    w.i64(offset);
  }
  void restore(StateReader& r) {
    const uint64_t index = r.u64();
    const bool open = r.boolean();
    const int64_t offset = r.i64();
    r.check(index <= files_.size() && (!open || index >= 1), "a file index outside the file list");
    r.check(offset >= 0 && (open || offset == 0), "a negative line offset");
    index_ = static_cast<std::size_t>(index);
    if (!open) return;
    const std::string& path = files_[index_ - 1];
    std::uint64_t size = 0;
    file_ = open_file(path, "text_line_dataset", &size);
    MIRRORED_ENFORCE(static_cast<uint64_t>(offset) <= size, InvalidArgumentError, r.op(), ": \"", path, "\" has ", size,
                     " bytes, fewer than the saved offset ", offset);
    if (::fseeko(file_.get(), static_cast<off_t>(offset), SEEK_SET) != 0)
      ::mirrored::detail::throw_file_error("text_line_dataset: ", "seeking in", path, errno);
  }

 private:
  // Reads one line without its "\n" or "\r\n"; false at the end of the file. A read error is
  // an error naming the file and errno, not an end of file (which would lose data silently).
  bool read_line() {
    line_.clear();
    int c;
    bool any = false;
    errno = 0;
    while ((c = std::getc(file_.get())) != EOF) {
      any = true;
      if (c == '\n') break;
      line_.push_back(static_cast<char>(c));
    }
    if (c == EOF && std::ferror(file_.get()))
      ::mirrored::detail::throw_file_error("text_line_dataset: ", "reading", files_[index_ - 1], errno);
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    return any;
  }

  std::vector<std::string> files_;
  std::stop_token stop_;
  std::size_t index_ = 0;
  File file_;
  std::string line_;
};

}  // namespace

std::unique_ptr<Cursor<Tensor<uint8_t>>> open_record_files(const std::vector<std::string>& files,
                                                           const RecordFormat& format, const OpenContext& ctx) {
  return std::make_unique<RecordCursor>(my_files(files, ctx), format, ctx.stop);
}

std::unique_ptr<Cursor<Tensor<uint8_t>>> open_line_files(const std::vector<std::string>& files,
                                                         const OpenContext& ctx) {
  return std::make_unique<LineCursor>(my_files(files, ctx), ctx.stop);
}

std::unique_ptr<Cursor<Tensor<uint8_t>>> restore_record_files(const std::vector<std::string>& files,
                                                              const RecordFormat& format, const OpenContext& ctx,
                                                              StateReader& r) {
  auto c = std::make_unique<RecordCursor>(my_files(files, ctx), format, ctx.stop);
  c->restore(r);
  return c;
}

std::unique_ptr<Cursor<Tensor<uint8_t>>> restore_line_files(const std::vector<std::string>& files,
                                                            const OpenContext& ctx, StateReader& r) {
  auto c = std::make_unique<LineCursor>(my_files(files, ctx), ctx.stop);
  c->restore(r);
  return c;
}

std::string describe_files(const std::vector<std::string>& files, bool lines, const RecordFormat& format) {
  // The names go in as a hash: a state stays small, and a different file list is still refused.
  std::string names;
  for (const std::string& f : files) {
    names += f;
    names.push_back('\0');
  }
  const uint64_t hash = ::mirrored::detail::fnv1a(names);
  if (lines) return str_cat("text_line_dataset(", files.size(), " files, names ", hash, ")");
  return str_cat("fixed_length_record_dataset(", files.size(), " files, names ", hash,
                 ", record_bytes=", format.record_bytes, ", header_bytes=", format.header_bytes,
                 ", footer_bytes=", format.footer_bytes, ")");
}

}  // namespace mirrored::data::detail

namespace mirrored::data {

std::string to_string(const Tensor<uint8_t>& bytes) {
  const std::vector<uint8_t> host = bytes.to_vector();
  return std::string(host.begin(), host.end());
}

}  // namespace mirrored::data
