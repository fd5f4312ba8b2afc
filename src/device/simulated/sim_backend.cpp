// The simulated GPU's device backend (sim_backend.hpp).
#include "device/simulated/sim_backend.hpp"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "device/host/host_backend.hpp"
#include "device/host/host_optimizer.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail::sim {
namespace {

// Fresh blocks are filled with this byte in stream order, so a read of memory nobody wrote yet
// shows it (cudaMalloc gives no guarantee either).
constexpr int kPoison = 0xA5;

std::shared_ptr<unsigned char[]> capture(const void* src, std::size_t bytes) {
  std::shared_ptr<unsigned char[]> copy(new unsigned char[bytes]);
  std::memcpy(copy.get(), src, bytes);
  return copy;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Chip.

void* Chip::allocate(std::size_t bytes) {
  {
    std::lock_guard lock(mu_);
    if (bytes > capacity_ - used_) return nullptr;
    used_ += bytes;
  }
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) {
    std::lock_guard lock(mu_);
    used_ -= bytes;
  }
  return p;
}

void Chip::free(void* p, std::size_t bytes) noexcept {
  std::vector<Backend*> backends;
  {
    std::lock_guard lock(mu_);
    backends = backends_;
  }
  for (Backend* b : backends) b->drain();
  std::free(p);
  std::lock_guard lock(mu_);
  used_ -= bytes;
}

void Chip::add(Backend* backend) {
  std::lock_guard lock(mu_);
  backends_.push_back(backend);
}

// ---------------------------------------------------------------------------------------------
// Backend: streams.

Backend::Backend(const Device& logical, Chip& chip, const Options& options)
    : logical_(logical),
      chip_(chip),
      options_(options),
      compute_(make_stream("compute")),
      allocator_(MemoryPolicy{&chip, logical}),
      ready_(logical.short_name(), this),
      done_(logical.short_name(), this) {}

std::unique_ptr<Stream> Backend::make_stream(const char* what) {
  const uint64_t seed = options_.seed * 1000003u + static_cast<uint64_t>(logical_.index()) * 131u;
  const int physical = chip_.physical();
  const std::string where = logical_.short_name() + " (physical GPU " + std::to_string(physical) + ")";
  return std::make_unique<Stream>(logical_.short_name() + " " + what + " stream", seed, options_.max_delay_us,
                                  [physical, where, what](const std::string& failure) {
                                    mark_gpu_unusable(physical,
                                                      str_cat("simulated ", where, " ", what, " stream: ", failure));
                                  });
}

Stream& Backend::stream_made_on_first_use(std::atomic<Stream*>& published, std::unique_ptr<Stream>& owner,
                                          const char* what) {
  if (Stream* s = published.load(std::memory_order_acquire)) return *s;
  std::lock_guard lock(streams_mu_);
  if (!owner) {
    owner = make_stream(what);
    published.store(owner.get(), std::memory_order_release);
  }
  return *owner;
}

Stream& Backend::stream(StreamKind kind) {
  if (kind == StreamKind::compute) return *compute_;
  return stream_made_on_first_use(communication_, communication_owner_, "communication");
}

Stream& Backend::copy_stream() { return stream_made_on_first_use(copy_, copy_owner_, "copy"); }

Stream& Backend::stream_for_call() {
  check_gpu_usable(logical_, chip_.physical());
  return stream(current_stream());
}

void Backend::drain() noexcept {
  for (Stream* s :
       {compute_.get(), communication_.load(std::memory_order_acquire), copy_.load(std::memory_order_acquire)})
    if (s) s->wait(s->last_ticket(), Clock::time_point::max());
}

void Backend::check_stream(const Stream& s, const char* op) const {
  const std::string failure = s.failure();
  if (failure.empty()) return;
  throw InternalError(str_cat(op, " failed on ", describe_gpu_call_site(logical_, chip_.physical()),
                              " (simulated): the ", s.name(), " failed: ", failure,
                              "; this error is sticky: the device must be reset (restart the process) before it can "
                              "run work again"));
}

void Backend::wait_stream(const Deadline& deadline, const char* op) {
  // The stream's own failure first: its thread marks the chip unusable when the work fails, and a
  // synchronisation that comes after must still report that failure itself (InternalError), as
  // CUDA returns a sticky error to the first call that waits for the stream, not a refusal.
  Stream& s = stream(current_stream());
  check_stream(s, op);
  check_gpu_usable(logical_, chip_.physical());
  count_host_sync();
  if (!s.wait(s.last_ticket(), deadline.time_point())) {
    throw DeadlineExceededError(str_cat(op, " on ", describe_gpu_call_site(logical_, chip_.physical()),
                                        ": the work queued on the simulated ", s.name(), " did not finish within ",
                                        deadline.timeout_seconds(), " s"));
  }
  check_stream(s, op);
}

void Backend::synchronize_until(const Deadline& deadline) {
  wait_stream(deadline, "synchronize");
  raise_division_by_zero(current_stream());
}

void Backend::wait_keeping_flags(const Deadline& deadline) { wait_stream(deadline, "wait_keeping_flags"); }

std::unique_ptr<DeviceEvent> Backend::create_event() {
  check_gpu_usable(logical_, chip_.physical());
  return std::make_unique<Event>(logical_.short_name(), this);
}

void Backend::record_event(DeviceEvent& event) {
  Stream& s = stream_for_call();
  if (fail_record_event_in_.load() > 0 && fail_record_event_in_.fetch_sub(1) == 1)
    throw InternalError(str_cat("record_event on ", describe_gpu_call_site(logical_, chip_.physical()),
                                ": injected failure (test hook)"));
  auto* e = dynamic_cast<Event*>(&event);
  MIRRORED_ENFORCE(e != nullptr, InternalError, "record_event on ", logical_.short_name(),
                   ": the event was not made by a simulated GPU");
  e->record(s);
}

void Backend::wait_event(const DeviceEvent& event) {
  Stream& s = stream_for_call();
  const auto* e = dynamic_cast<const Event*>(&event);
  MIRRORED_ENFORCE(e != nullptr, InternalError, "wait_event on ", logical_.short_name(),
                   ": the event was not made by a simulated GPU");
  const auto [other, ticket] = e->latest();
  if (!other || other == &s) return;  // never recorded, or already in this stream's order
  s.enqueue([other = other, ticket = ticket] { other->wait(ticket, Clock::time_point::max()); });
}

void Backend::record_stream_use(const void* block, const DeviceBackend& user) {
  const auto* u = dynamic_cast<const Backend*>(&user);
  if (!u) return;  // host work is complete when it returns
  auto* mutable_user = const_cast<Backend*>(u);
  allocator_.record_stream(block, &mutable_user->stream(u->current_stream()));
}

void Backend::inject_fault(const std::string& what) {
  stream_for_call().enqueue([what] { throw InternalError(what); });
}

// ---------------------------------------------------------------------------------------------
// Backend: memory and copies.

void* Backend::allocate(std::size_t bytes) {
  Stream& s = stream_for_call();
  void* p = allocator_.allocate(bytes, &s);
  s.enqueue([p, bytes] { std::memset(p, kPoison, bytes); });
  return p;
}

void Backend::deallocate(void* ptr, std::size_t) noexcept { allocator_.deallocate(ptr); }

void Backend::copy_from_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  Stream& s = stream_for_call();
  count_host_to_device(bytes);
  s.enqueue([dst, data = capture(src, bytes), bytes] { std::memcpy(dst, data.get(), bytes); });
}

void Backend::copy_to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check_gpu_usable(logical_, chip_.physical());
  count_device_to_host(bytes);
  // Complete on return, and deliberately not ordered after queued work (see device_backend.hpp).
  std::memcpy(dst, src, bytes);
}

void Backend::copy_within(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  stream_for_call().enqueue([dst, src, bytes] { std::memmove(dst, src, bytes); });
}

void Backend::copy_rows_within(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                               std::size_t width, std::size_t height) {
  if (width == 0 || height == 0) return;
  stream_for_call().enqueue([=] {
    for (std::size_t k = 0; k < height; ++k)
      std::memmove(static_cast<unsigned char*>(dst) + k * dst_pitch,
                   static_cast<const unsigned char*>(src) + k * src_pitch, width);
  });
}

void Backend::prefetch_from_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  Stream& main = stream_for_call();
  Stream& copy = copy_stream();
  // Only the work queued on the main stream so far may still use dst's memory.
  const uint64_t before = main.last_ticket();
  copy.enqueue([&main, before] { main.wait(before, Clock::time_point::max()); });
  copy.enqueue([dst, data = capture(src, bytes), bytes] { std::memcpy(dst, data.get(), bytes); });
  count_host_to_device(bytes);
  count_host_sync();
  const Deadline deadline = Deadline::after(default_synchronize_timeout_s());
  if (!copy.wait(copy.last_ticket(), deadline.time_point())) {
    throw DeadlineExceededError(str_cat("prefetch_from_host on ", describe_gpu_call_site(logical_, chip_.physical()),
                                        ": the simulated ", copy.name(), " did not finish within ",
                                        deadline.timeout_seconds(), " s"));
  }
  check_stream(copy, "prefetch_from_host");
}

// ---------------------------------------------------------------------------------------------
// Backend: kernels, computed with the host backend's loops on the stream's thread.

void Backend::fill(DType dtype, void* dst, int64_t count, const void* value) {
  if (count <= 0) return;
  Stream& s = stream_for_call();
  unsigned char v[8];
  std::memcpy(v, value, dtype_size(dtype));
  s.enqueue([=] { host_backend().fill(dtype, dst, count, v); });
}

void Backend::binary(BinaryOp op, DType dtype, const void* a, bool a_scalar, const void* b, bool b_scalar, void* out,
                     int64_t count) {
  if (count <= 0) return;
  Stream& s = stream_for_call();
  if (op != BinaryOp::div || dtype_is_floating(dtype)) {
    s.enqueue([=] { host_backend().binary(op, dtype, a, a_scalar, b, b_scalar, out, count); });
    return;
  }
  // Integer division: the kernel notes a zero divisor on the stream, with the replica that
  // enqueued it, and that replica's next synchronize of the stream raises it (as the CUDA backend
  // does); the host does not wait here.
  DivisionFlag* flag = &division_flag(current_stream());
  const int replica = calling_replica_id();
  s.enqueue([=] {
    try {
      host_backend().binary(op, dtype, a, a_scalar, b, b_scalar, out, count);
    } catch (const InvalidArgumentError& e) {
      std::lock_guard lock(flag->mu);
      if (flag->error.empty()) {  // the first, like the smallest index on CUDA
        flag->error = e.what();
        flag->replica = replica;
      }
    }
  });
}

void Backend::raise_division_by_zero(StreamKind kind) {
  DivisionFlag& flag = division_flag(kind);
  const int caller = calling_replica_id();
  std::string error;
  int replica = -1;
  {
    std::lock_guard lock(flag.mu);
    // Another replica's wait (a collective reading this replica's data) leaves it for its owner.
    if (flag.error.empty() || (flag.replica >= 0 && caller >= 0 && caller != flag.replica)) return;
    error = std::exchange(flag.error, std::string());
    replica = std::exchange(flag.replica, -1);
  }
  throw InvalidArgumentError(str_cat(error, " on ", describe_gpu_call_site(logical_, chip_.physical(), replica)));
}

void Backend::sum_n(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count) {
  sum_n_mean(dtype, inputs, num_inputs, out, count, 0);
}

// The host's fused sum and MEAN (float16 and bfloat16 divided in float before their one rounding),
// as the CUDA backend's: the default's sum-then-divide rounded them twice on a simulated GPU.
void Backend::sum_n_mean(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count,
                         int64_t mean_divisor) {
  if (count <= 0) return;
  MIRRORED_ENFORCE(num_inputs >= 1, InternalError, "sum_n on ", logical_.short_name(), " with ", num_inputs, " inputs");
  Stream& s = stream_for_call();
  std::vector<const void*> in(inputs, inputs + num_inputs);
  s.enqueue(
      [=, in = std::move(in)] { host_backend().sum_n_mean(dtype, in.data(), num_inputs, out, count, mean_divisor); });
}

void Backend::sum_axis(DType dtype, const void* in, int64_t outer, int64_t length, int64_t inner, void* out) {
  if (outer * inner <= 0) return;
  stream_for_call().enqueue([=] { host_backend().sum_axis(dtype, in, outer, length, inner, out); });
}

void Backend::divide(DType dtype, void* inout, int64_t count, int64_t divisor) {
  if (!dtype_is_floating(dtype))
    MIRRORED_ENFORCE(divisor != 0, InvalidArgumentError, "divide: integer division by zero");
  if (count <= 0) return;
  stream_for_call().enqueue([=] { host_backend().divide(dtype, inout, count, divisor); });
}

void Backend::cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t count) {
  if (count <= 0) return;
  stream_for_call().enqueue([=] { host_backend().cast(src_dtype, src, dst_dtype, dst, count); });
}

void Backend::apply_optimizer(DType dtype, const OptimizerUpdate& u, const UpdateSegment* segments, int num_segments,
                              const int64_t* step_in, int64_t* step_out) {
  const std::string where = logical_.short_name();
  check_optimizer_arguments(where.c_str(), dtype, u, num_segments, step_in, step_out);
  Stream& s = stream_for_call();
  if (fail_apply_optimizer_in_.load() > 0 && fail_apply_optimizer_in_.fetch_sub(1) == 1)
    throw InternalError(str_cat("apply_optimizer kernel launch failed on ",
                                describe_gpu_call_site(logical_, chip_.physical()),
                                ": injected launch failure (test hook)"));
  // The step is read on the stream, when the kernel runs, as on a GPU.
  std::vector<UpdateSegment> segs(segments, segments + num_segments);
  s.enqueue([=, segs = std::move(segs)] {
    host_apply_optimizer(dtype, u, segs.data(), static_cast<int>(segs.size()), step_in, step_out);
  });
}

void Backend::all_reduce_fused(DType dtype, const void* const* in, void* const* out, int n, int64_t count,
                               int64_t mean_divisor) {
  if (count <= 0) return;
  MIRRORED_ENFORCE(n >= 1 && n <= max_fused_replicas(), InternalError, "all_reduce_fused on ", logical_.short_name(),
                   " with ", n, " replicas");
  Stream& s = stream_for_call();
  std::vector<const void*> ins(in, in + n);
  std::vector<void*> outs(out, out + n);
  s.enqueue([=, ins = std::move(ins), outs = std::move(outs)] {
    // Every input is read before any output is written, like the one CUDA kernel.
    const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
    std::vector<unsigned char> total(bytes);
    host_backend().sum_n_mean(dtype, ins.data(), n, total.data(), count, mean_divisor);
    for (void* o : outs) std::memcpy(o, total.data(), bytes);
  });
}

}  // namespace mirrored::detail::sim
