#pragma once
/// \file
/// Saving and restoring variables (any dtype, plain or distributed) through the checkpoint file
/// format of <mirrored/checkpoint.hpp>.

#include <functional>
#include <map>
#include <string>

#include "mirrored/checkpoint.hpp"
#include "mirrored/variable.hpp"

namespace mirrored::checkpoint {

/// A variable of any element type, as `save` and `restore` see it. Converts implicitly from
/// `Variable<T>`, so `save(path, {{"dense/kernel", w}, {"dense/bias", b}})` works.
class VariableRef {
 public:
  template <class T>
  VariableRef(const Variable<T>& v)  // NOLINT(google-explicit-constructor): a handle, by design
      : dtype_(dtype_of<T>()),
        shape_(v.shape()),
        read_([v] { return detail::TensorAccess::erase(v.value()); }),
        prepare_write_([v](const detail::UntypedTensor& t) {
          return detail::VariableAccess::prepare_assign(v, detail::TensorAccess::restore<T>(t));
        }) {}

  DType dtype() const noexcept { return dtype_; }
  const Shape& shape() const noexcept { return shape_; }
  /// The value a cross-replica read gives (a mirrored variable's copy; a sync-on-read variable's
  /// aggregate).
  detail::UntypedTensor read() const { return read_(); }
  /// A cross-replica assign: every replica's copy.
  void write(const detail::UntypedTensor& t) const { prepare_write(t)(); }
  /// Phase one of `write(t)`: every check (the strategy, the context, the shape) and every copy,
  /// nothing changed; the returned phase two stores the copies and cannot fail.
  /// \throws what `write` throws.
  std::function<void()> prepare_write(const detail::UntypedTensor& t) const { return prepare_write_(t); }

 private:
  DType dtype_;
  Shape shape_;
  std::function<detail::UntypedTensor()> read_;
  std::function<std::function<void()>(const detail::UntypedTensor&)> prepare_write_;
};

/// Variables by the name they are stored under.
using VariableMap = std::map<std::string, VariableRef>;

/// Saves the variables' values to `path` (atomically; see `save_tensors`). Call it in
/// cross-replica context (not inside `run`). \throws FailedPreconditionError inside `run`;
/// the errors of `save_tensors`.
void save(const std::string& path, const VariableMap& variables, const Metadata& metadata = {});

/// Restores every variable from `path` (tensors of the file that `variables` does not name are
/// left alone, without a message): the whole file is loaded and checked (checksum, every
/// name present, dtypes and shapes equal), and every variable is checked to be writable here (its
/// strategy alive and the current one) and its new copies made, before any variable changes, so a
/// failed restore changes nothing. Inside a strategy's scope (or for its variables anywhere in cross-replica
/// context) every replica's copy is updated. \throws NotFoundError for a missing file or tensor;
/// InvalidArgumentError for a corrupt or truncated file or a dtype/shape mismatch, naming the
/// tensor; FailedPreconditionError inside `run`, for a variable of another strategy than the
/// current one ("Mixing different tf.distribute.Strategy objects") or of a destroyed strategy.
void restore(const std::string& path, const VariableMap& variables);

}  // namespace mirrored::checkpoint
