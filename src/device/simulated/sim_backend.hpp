#pragma once
// Private: the device backend of one simulated logical GPU. Its memory is ordinary host memory
// owned by the backend (never handed to host code as host memory: every host read goes through
// copy_to_host), its streams run their work on threads of their own (sim_stream.hpp), and it
// keeps exactly the guarantees DeviceBackend documents, no more: copy_to_host reads device memory
// at once, without waiting for queued work; copy_from_host and every kernel run in stream order;
// a host read is correct only after synchronize(). Kernels compute with the host backend's loops,
// so results equal the host's bit for bit.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/gpu/caching_allocator.hpp"
#include "device/gpu/gpu_backend.hpp"
#include "device/simulated/sim_stream.hpp"

namespace mirrored::detail::sim {

/// How the simulated GPUs behave (from the environment; see docs/gpu.md).
struct Options {
  uint64_t seed = 1;                                ///< MIRRORED_SIMULATED_GPU_SEED
  int max_delay_us = 200;                           ///< MIRRORED_SIMULATED_GPU_DELAY_US
  std::size_t memory_bytes = std::size_t{8} << 30;  ///< MIRRORED_SIMULATED_GPU_MEMORY_MB, per physical GPU
};

class Backend;

/// One physical simulated GPU: its memory budget and the backends of its logical GPUs.
class Chip {
 public:
  Chip(int physical, std::size_t memory_bytes) : physical_(physical), capacity_(memory_bytes) {}
  int physical() const noexcept { return physical_; }
  /// Host memory for a device block (nullptr beyond the chip's capacity).
  void* allocate(std::size_t bytes);
  /// Frees a block once every stream of the chip has finished its queued work (cudaFree waits for
  /// the device too).
  void free(void* p, std::size_t bytes) noexcept;
  void add(Backend* backend);

 private:
  const int physical_;
  const std::size_t capacity_;
  std::mutex mu_;
  std::size_t used_ = 0;
  std::vector<Backend*> backends_;
};

/// The caching allocator's policy: the chip's memory, events as (stream, ticket).
struct MemoryPolicy {
  using Stream = const sim::Stream*;
  struct Event {
    const sim::Stream* stream = nullptr;
    uint64_t ticket = 0;
  };
  Chip* chip = nullptr;
  Device logical;
  void* allocate(std::size_t bytes) { return chip->allocate(bytes); }
  void free(void* p, std::size_t bytes) noexcept { chip->free(p, bytes); }
  std::string describe() const { return describe_gpu_call_site(logical, chip->physical()); }
  bool record_event(Stream s, Event& e) noexcept {
    e = Event{s, s->last_ticket()};
    return true;
  }
  bool event_reached(const Event& e) noexcept { return e.stream->reached(e.ticket); }
  void synchronize_event(const Event& e) noexcept { e.stream->wait(e.ticket, Clock::time_point::max()); }
  void destroy_event(Event&) noexcept {}
  void synchronize_stream(Stream s) noexcept { s->wait(s->last_ticket(), Clock::time_point::max()); }
};

class Backend final : public GpuBackend {
 public:
  Backend(const Device& logical, Chip& chip, const Options& options);
  ~Backend() override = default;  // never runs: backends live as long as the process

  const Device& device() const noexcept override { return logical_; }
  int physical() const noexcept override { return chip_.physical(); }

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) noexcept override;
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override;
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override;
  void copy_within(void* dst, const void* src, std::size_t bytes) override;
  void copy_rows_within(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t width,
                        std::size_t height) override;
  /// On the copy stream, after the work queued on the calling thread's stream before the call.
  void prefetch_from_host(void* dst, const void* src, std::size_t bytes) override;
  void fill(DType dtype, void* dst, int64_t count, const void* value) override;
  void binary(BinaryOp op, DType dtype, const void* a, bool a_scalar, const void* b, bool b_scalar, void* out,
              int64_t count) override;
  void sum_n(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count) override;
  void sum_n_mean(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count,
                  int64_t mean_divisor) override;
  void sum_axis(DType dtype, const void* in, int64_t outer, int64_t length, int64_t inner, void* out) override;
  void divide(DType dtype, void* inout, int64_t count, int64_t divisor) override;
  void cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t count) override;
  /// Runs the host's update on the stream (bitwise the host's results).
  void apply_optimizer(DType dtype, const OptimizerUpdate& u, const UpdateSegment* segments, int num_segments,
                       const int64_t* step_in, int64_t* step_out) override;
  /// Waits for the calling thread's stream, then raises the calling replica's division by zero.
  void synchronize_until(const Deadline& deadline) override;
  void wait_keeping_flags(const Deadline& deadline) override;

  std::unique_ptr<DeviceEvent> create_event() override;
  void record_event(DeviceEvent& event) override;
  void wait_event(const DeviceEvent& event) override;
  void record_stream_use(const void* block, const DeviceBackend& user) override;

  int max_fused_replicas() const noexcept override { return 16; }
  void all_reduce_fused(DType dtype, const void* const* in, void* const* out, int n, int64_t count,
                        int64_t mean_divisor) override;
  DeviceEvent& ready_event() override { return ready_; }
  DeviceEvent& done_event() override { return done_; }

  /// The stream `kind` (made on first use).
  Stream& stream(StreamKind kind);
  /// Waits (without deadline) for everything queued on this backend's streams.
  void drain() noexcept;
  CachingAllocatorStats allocator_stats() const { return allocator_.stats(); }

  // Test hooks (tests/gpu_sim/).
  /// The next piece of work on `kind` starts no earlier than `delay` from now.
  void delay_next(StreamKind kind, std::chrono::milliseconds delay) { stream(kind).delay_next(delay); }
  /// Enqueues work that fails on the calling thread's stream: a sticky device error.
  void inject_fault(const std::string& what);
  /// The `skip + 1`-th record_event from now throws InternalError.
  void fail_record_event(int skip) { fail_record_event_in_.store(skip + 1); }
  /// The `skip + 1`-th apply_optimizer launch from now fails as a kernel launch does (InternalError,
  /// not sticky: the device stays usable), before it enqueues anything: after `skip` packs ran.
  void fail_apply_optimizer(int skip) { fail_apply_optimizer_in_.store(skip + 1); }

 private:
  Stream& stream_for_call();  // the calling thread's stream, after checking the device is usable
  Stream& copy_stream();
  // Throws the stream's failure (a sticky error: the chip is then unusable).
  void check_stream(const Stream& s, const char* op) const;
  std::unique_ptr<Stream> make_stream(const char* what);
  // The stream `owner` holds, made (`what`) and published by the first caller.
  Stream& stream_made_on_first_use(std::atomic<Stream*>& published, std::unique_ptr<Stream>& owner, const char* what);
  // An integer division by zero found on a stream (sticky until raised), with the replica whose
  // kernel found it: only a synchronize of that replica (or of a thread outside every replica)
  // raises it.
  struct DivisionFlag {
    std::mutex mu;
    std::string error;
    int replica = -1;
  };
  DivisionFlag& division_flag(StreamKind kind) {
    return kind == StreamKind::compute ? compute_div_ : communication_div_;
  }
  void raise_division_by_zero(StreamKind kind);
  // Waits for the calling thread's stream (counted as a host wait); throws its failure.
  void wait_stream(const Deadline& deadline, const char* op);

  const Device logical_;
  Chip& chip_;
  const Options options_;
  const std::unique_ptr<Stream> compute_;
  std::mutex streams_mu_;  // making the streams made on first use
  std::unique_ptr<Stream> communication_owner_, copy_owner_;
  std::atomic<Stream*> communication_{nullptr}, copy_{nullptr};  // published once fully made
  CachingAllocator<MemoryPolicy> allocator_;
  Event ready_, done_;
  std::atomic<int> fail_record_event_in_{0};
  std::atomic<int> fail_apply_optimizer_in_{0};
  DivisionFlag compute_div_, communication_div_;
};

}  // namespace mirrored::detail::sim
