#pragma once
/// \file
/// Internal: the binary form of an iterator's position (`Dataset<E>::Iterator::save_state`,
/// `DistributedIterator<E>::save_state`). `StateWriter` appends fixed-width little-endian fields,
/// strings and tensors; `StateReader` reads them back with every length and count checked against
/// the bytes left, so that truncated or corrupt state is an InvalidArgumentError, never a read
/// past the end. Compiled in src/data/iterator_state.cpp.
/// Needed by every cursor's `save` and every node's `restore` (node.hpp).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "mirrored/data/element.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::data::detail {

/// Appends the fields of an iterator state. A writer also holds the background threads it paused
/// while the state was taken (`hold`), and lets them go when it is destroyed, so that every
/// cursor of a pass is saved at one consistent moment.
class StateWriter {
 public:
  /// `pause_only`: nothing is recorded (tensors are not copied); the cursors are only paused, as a
  /// restore does with the pass it replaces until the new one is in place.
  explicit StateWriter(bool pause_only = false) : pause_only_(pause_only) {}
  /// Resumes what `hold` paused, most recent first.
  ~StateWriter();
  StateWriter(const StateWriter&) = delete;
  StateWriter& operator=(const StateWriter&) = delete;

  bool pause_only() const noexcept { return pause_only_; }
  void u8(uint8_t v);
  void boolean(bool v) { u8(v ? 1 : 0); }
  void u64(uint64_t v);
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void str(std::string_view s);
  /// dtype, device, shape and the bytes (host byte order; copied to the host when on a GPU).
  void tensor(const UntypedTensor& t);
  /// `resume` runs when this writer is destroyed (unless `forget` was called first).
  void hold(std::function<void()> resume);
  /// Drops the pending `resume` calls (what they would resume has been destroyed).
  void forget() noexcept { resume_.clear(); }
  /// The bytes written so far (the writer is left empty).
  std::string take() { return std::move(bytes_); }

 private:
  bool pause_only_;
  std::string bytes_;
  std::vector<std::function<void()>> resume_;
};

/// Reads what a `StateWriter` wrote. `op` names the operation in errors ("Dataset iterator
/// restore_state").
class StateReader {
 public:
  StateReader(std::string_view bytes, std::string op) : bytes_(bytes), op_(std::move(op)) {}

  const std::string& op() const noexcept { return op_; }
  uint8_t u8();
  bool boolean();
  uint64_t u64();
  int64_t i64() { return static_cast<int64_t>(u64()); }
  std::string str();
  /// Read tensors onto the host instead of the devices they were saved from (a state of another
  /// worker, whose devices this process may lack).
  void read_to_host(bool on) noexcept { to_host_ = on; }
  /// A tensor of `dtype` (anything else is corrupt state), on the device it was saved from (or
  /// the host, see `read_to_host`).
  /// \throws InvalidArgumentError for a wrong dtype, a bad shape or too few bytes; what placing
  /// it on its device throws (NotFoundError for a GPU this process lacks).
  UntypedTensor tensor(DType dtype);
  /// A count of items of at least `min_bytes` bytes each: \throws InvalidArgumentError when more
  /// than `max` (negative: no limit) or more than the bytes left could hold.
  uint64_t count(int64_t max, std::size_t min_bytes, const char* what);
  /// \throws InvalidArgumentError unless every byte was read.
  void expect_end() const;
  /// \throws InvalidArgumentError "<op>: corrupt iterator state: <why>".
  [[noreturn]] void corrupt(const std::string& why) const;
  /// As `corrupt` when `ok` is false.
  void check(bool ok, const char* why) const {
    if (!ok) corrupt(why);
  }

 private:
  const unsigned char* take(std::size_t n, const char* what);

  std::string_view bytes_;
  std::size_t pos_ = 0;
  std::string op_;
  bool to_host_ = false;
};

/// The demangled name of a type, for the errors of nodes and cursors without state support.
std::string type_name(const std::type_info& type);
/// \throws UnimplementedError: `what` (a node or cursor type) cannot save or restore its state.
[[noreturn]] void throw_no_state(const char* op, const std::type_info& what);

/// Writes an element's components (see `StateWriter::tensor`).
template <class E>
void write_element(StateWriter& w, const E& e) {
  if (w.pause_only()) return;
  for (const UntypedTensor& t : erase_element(e)) w.tensor(t);
}

/// Reads an element written by `write_element`. \throws as `StateReader::tensor`.
template <class E>
E read_element(StateReader& r) {
  std::vector<UntypedTensor> parts;
  for (DType d : element_dtypes<E>()) parts.push_back(r.tensor(d));
  return restore_element<E>(parts);
}

/// The magic, format version and kind (dataset or distributed iterator) a state starts with.
enum class StateKind : uint8_t { dataset = 1, distributed = 2 };
/// The format version `write_state_header` writes (2: a distributed iterator's state records
/// the steps taken in its pass).
inline constexpr uint64_t kStateVersionWithSteps = 2;
void write_state_header(StateWriter& w, StateKind kind);
/// Returns the state's format version (1 or 2). \throws InvalidArgumentError when the bytes are no
/// iterator state of `kind`.
uint64_t read_state_header(StateReader& r, StateKind kind);
/// \throws InvalidArgumentError naming both pipelines unless `saved == current`.
void check_same_pipeline(const StateReader& r, const std::string& saved, const std::string& current);

}  // namespace mirrored::data::detail
