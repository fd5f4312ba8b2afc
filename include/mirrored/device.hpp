#pragma once
/// \file
/// Device names: parsing, canonical forms and discovery.

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace mirrored {

/// Kind of device a replica runs on.
enum class DeviceType { CPU, GPU };

/// "CPU" or "GPU".
const char* device_type_name(DeviceType type) noexcept;

/// A fully specified device: `/job:<job>/replica:<r>/task:<t>/device:<TYPE>:<index>`.
class Device {
 public:
  /// CPU:0 of the local job.
  Device() = default;
  /// A device of the local job (`/job:localhost/replica:0/task:0`).
  Device(DeviceType type, int index) : type_(type), index_(index) {}

  /// Parses any of TF's accepted spellings (`GPU:0`, `gpu:0`, `/gpu:0`, `/device:GPU:0`,
  /// `/job:worker/task:1/cpu:0`, `/job:localhost/replica:0/task:0/device:CPU:0`). Missing job is
  /// `localhost`, missing replica/task are 0.
  /// \throws InvalidArgumentError on an unknown attribute, a repeated or second device type,
  ///         a lower-case type after `device:`, a missing or non-integer index.
  static Device parse(std::string_view spec);

  DeviceType type() const noexcept { return type_; }
  int index() const noexcept { return index_; }
  const std::string& job() const noexcept { return job_; }
  int replica() const noexcept { return replica_; }
  int task() const noexcept { return task_; }
  /// True for host devices (any `CPU:k`), whose memory is ordinary host memory.
  bool is_host() const noexcept { return type_ == DeviceType::CPU; }

  /// Canonical form, e.g. `/job:localhost/replica:0/task:0/device:GPU:0`.
  std::string to_string() const;
  /// Short form, e.g. `GPU:0` (used in messages).
  std::string short_name() const;

  friend bool operator==(const Device& a, const Device& b) = default;

 private:
  std::string job_ = "localhost";
  int replica_ = 0;
  int task_ = 0;
  DeviceType type_ = DeviceType::CPU;
  int index_ = 0;
};

/// Prints the canonical form.
std::ostream& operator<<(std::ostream& os, const Device& d);

/// The host device every result of a cross-replica reduction lands on.
inline const Device cpu0{};

/// The device of a tensor made without one: inside `Strategy::run`, the calling replica's device
/// (TF runs the replica function under its device's scope); everywhere else (cross-replica context,
/// a merge_fn, no strategy) CPU:0.
const Device& default_device() noexcept;

namespace detail {
/// While alive, `default_device()` on this thread is `device` (TF's `with tf.device(...)`): the
/// value function of `experimental_distribute_values_from_function` runs under its replica's
/// device. Scopes nest; not movable.
class DefaultDeviceScope {
 public:
  explicit DefaultDeviceScope(const Device& device) noexcept;
  ~DefaultDeviceScope();
  DefaultDeviceScope(const DefaultDeviceScope&) = delete;
  DefaultDeviceScope& operator=(const DefaultDeviceScope&) = delete;

 private:
  Device device_;
  const Device* previous_;
};
}  // namespace detail

/// Logical devices of a type visible to this process. CPU: `{CPU:0}` (any `CPU:k` may still be
/// used as a replica device). GPU: physical GPUs (or their logical splits); none when the build
/// lacks CUDA or the runtime reports any error (e.g. no driver) — never throws for that.
std::vector<Device> list_logical_devices(DeviceType type);

/// True when `d` may hold tensors in this process (any CPU; a GPU index below the visible count).
bool device_exists(const Device& d);

/// What crossed between the host and one device since the process started: bytes each way
/// (copies to and from the device, staged copies included) and the times the host blocked on the
/// device (synchronize, event waits, flags read back). All zeros for a CPU device, whose memory is
/// the host's. For checking that a training step stays on the device, and for `--verbose` output.
struct TransferCounts {
  uint64_t host_to_device_bytes = 0;
  uint64_t device_to_host_bytes = 0;
  uint64_t host_syncs = 0;
};

/// The counts of `device`'s backend (logical GPUs count separately). Safe from any thread.
/// \throws NotFoundError for a GPU that is not visible.
TransferCounts transfer_counts(const Device& device);

namespace config {
/// Splits physical GPU `physical_gpu` into `count` logical GPUs (must be called before any
/// strategy uses GPUs). \throws NotFoundError if that GPU does not exist; InvalidArgumentError if
/// `count` < 1; FailedPreconditionError once GPU devices have been used.
void set_logical_gpu_devices(int physical_gpu, int count);
}  // namespace config

}  // namespace mirrored
