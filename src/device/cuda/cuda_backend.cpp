// The CUDA device backend: one per logical GPU, each with its own stream, caching allocator and
// pinned staging buffers; kernels in kernels.cu.
#include "device/cuda/cuda_backend.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <string_view>
#include <vector>

#include "device/cuda/kernels.hpp"
#include "device/gpu/gpu_runtime.hpp"
#include "device/gpu/logical_gpus.hpp"
#include "mirrored/errors.hpp"
#include "util/log.hpp"
#include "util/spin.hpp"

namespace mirrored::detail {

// ---------------------------------------------------------------------------------------------
// Errors, device guards and bounded waits.

bool cuda_error_is_sticky(cudaError_t err) noexcept {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorMpsClientTerminated: return true;
    default: return false;
  }
}

void throw_cuda_error(cudaError_t err, const char* call, const Device& logical, int physical) {
  (void)cudaGetLastError();  // clear a non-sticky error so that later calls start clean
  std::string message = str_cat(call, " failed on ", describe_gpu_call_site(logical, physical), ": ",
                                cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  if (cuda_error_is_sticky(err)) {
    // Every later CUDA call of this process fails the same way: say so, and refuse further work
    // on the device up front (check_gpu_usable) instead of failing wherever it next runs.
    mark_gpu_unusable(physical, str_cat(call, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
    message += str_cat("; this error is sticky: physical GPU ", physical,
                       " cannot run work again until the device is reset (restart the process)");
    throw InternalError(message);
  }
  switch (err) {
    case cudaErrorMemoryAllocation:
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
    case cudaErrorSystemNotReady: throw UnavailableError(message);
    default: throw InternalError(message);
  }
}

CudaDeviceGuard::CudaDeviceGuard(int physical, const Device& logical) {
  check_gpu_usable(logical, physical);
  int current = -1;
  const cudaError_t got = cudaGetDevice(&current);
  if (got == cudaSuccess && current == physical) return;
  const cudaError_t set = cudaSetDevice(physical);
  if (set != cudaSuccess) throw_cuda_error(set, "cudaSetDevice", logical, physical);
  previous_ = got == cudaSuccess ? current : -1;
}

CudaDeviceGuard::CudaDeviceGuard(int physical, std::nothrow_t) noexcept {
  int current = -1;
  const cudaError_t got = cudaGetDevice(&current);
  if (got == cudaSuccess && current == physical) return;
  if (cudaSetDevice(physical) != cudaSuccess) {
    (void)cudaGetLastError();
    ok_ = false;
    return;
  }
  previous_ = got == cudaSuccess ? current : -1;
}

CudaDeviceGuard::~CudaDeviceGuard() {
  if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
}

namespace {

using Clock = std::chrono::steady_clock;

// Polls `query` (cudaStreamQuery or cudaEventQuery) until it succeeds, fails, or the deadline passes.
template <class Query>
void poll_until(Query query, Clock::time_point deadline, double timeout_s, const char* what, const Device& logical,
                int physical) {
  Backoff backoff;
  while (true) {
    const cudaError_t q = query();
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) throw_cuda_error(q, what, logical, physical);
    // Not an error, but the runtime may keep it as this thread's last error, which a later
    // kernel launch check would then report.
    (void)cudaGetLastError();
    if (Clock::now() > deadline) {
      throw DeadlineExceededError(str_cat(what, " on ", describe_gpu_call_site(logical, physical),
                                          ": the device's work did not finish within ", timeout_s,
                                          " s (it may still be running)"));
    }
    backoff.pause();
  }
}

}  // namespace

void wait_cuda_stream(cudaStream_t stream, Clock::time_point deadline, double timeout_s, const char* what,
                      const Device& logical, int physical) {
  poll_until([&] { return cudaStreamQuery(stream); }, deadline, timeout_s, what, logical, physical);
}

// ---------------------------------------------------------------------------------------------
// Device memory.

void* CudaMemoryPolicy::allocate(std::size_t bytes) {
  CudaDeviceGuard guard(physical, logical);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;  // the caching allocator frees its cache and retries
  }
  if (err != cudaSuccess) throw_cuda_error(err, "cudaMalloc", logical, physical);
  return p;
}

void CudaMemoryPolicy::free(void* p, std::size_t) noexcept {
  CudaDeviceGuard guard(physical, std::nothrow);
  if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}

std::string CudaMemoryPolicy::describe() const { return describe_gpu_call_site(logical, physical); }

bool CudaMemoryPolicy::record_event(Stream s, Event& e) noexcept {
  CudaDeviceGuard guard(physical, std::nothrow);
  cudaEvent_t made = nullptr;
  if (!guard.ok() || cudaEventCreateWithFlags(&made, cudaEventDisableTiming) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (cudaEventRecord(made, s) != cudaSuccess) {
    (void)cudaGetLastError();
    (void)cudaEventDestroy(made);
    return false;
  }
  e = made;
  return true;
}

bool CudaMemoryPolicy::event_reached(const Event& e) noexcept {
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaSuccess) return true;
  (void)cudaGetLastError();
  // Not ready: not yet. Any other answer is a failed device, whose work will not touch the block.
  return q != cudaErrorNotReady;
}

void CudaMemoryPolicy::synchronize_event(const Event& e) noexcept {
  if (cudaEventSynchronize(e) != cudaSuccess) (void)cudaGetLastError();
}

void CudaMemoryPolicy::destroy_event(Event& e) noexcept {
  if (e && cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
  e = nullptr;
}

void CudaMemoryPolicy::synchronize_stream(Stream s) noexcept {
  if (cudaStreamSynchronize(s) != cudaSuccess) (void)cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// Events.

CudaEvent::CudaEvent(const Device& logical, int physical, DeviceBackend* counts)
    : logical_(logical), physical_(physical), counts_(counts) {
  CudaDeviceGuard guard(physical_, logical_);
  const cudaError_t err = cudaEventCreateWithFlags(&event_, cudaEventDisableTiming);
  if (err != cudaSuccess) throw_cuda_error(err, "cudaEventCreateWithFlags", logical_, physical_);
}

CudaEvent::~CudaEvent() {
  if (event_ && cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();
}

bool CudaEvent::query() const {
  const cudaError_t q = cudaEventQuery(event_);
  if (q == cudaSuccess) return true;
  if (q != cudaErrorNotReady) throw_cuda_error(q, "cudaEventQuery", logical_, physical_);
  (void)cudaGetLastError();
  return false;
}

void CudaEvent::synchronize(const Deadline& deadline) const {
  if (counts_) counts_->count_host_sync();
  poll_until([&] { return cudaEventQuery(event_); }, deadline.time_point(), deadline.timeout_seconds(),
             "cudaEventQuery (event synchronize)", logical_, physical_);
}

// ---------------------------------------------------------------------------------------------
// The backend table.

namespace {

struct BackendTable {
  std::mutex mu;
  std::map<int, CudaBackend*> backends;  // logical index -> backend (never destroyed)
};
BackendTable& backend_table() {
  static BackendTable* t = new BackendTable;  // outlives every tensor, even static ones
  return *t;
}

// Out of memory on one logical GPU: the other logical GPUs of its chip give their caches back.
void release_siblings(int physical, const CudaBackend* except) {
  auto& t = backend_table();
  std::lock_guard lock(t.mu);
  for (auto& [index, be] : t.backends)
    if (be != except && be->physical() == physical) be->release_cached();
}

std::size_t cache_limit_from_env() {
  const double mb = env_positive("MIRRORED_GPU_CACHE_MB", 0.0);
  if (mb <= 0) return std::numeric_limits<std::size_t>::max();
  return static_cast<std::size_t>(mb * 1024.0 * 1024.0);
}

}  // namespace

CudaBackend& cuda_backend(int index) {
  // A process on simulated GPUs never touches CUDA (its GPU:k are not CUDA devices).
  auto& runtime = gpu_runtime();
  MIRRORED_ENFORCE(std::string_view(runtime.name()) == "CUDA", FailedPreconditionError, "GPU:", index,
                   " is not a CUDA device: this process runs on ", runtime.name(), " GPUs (",
                   runtime.unavailable_reason(), "), which have no CUDA stream, allocator or NCCL");
  auto& t = backend_table();
  std::lock_guard lock(t.mu);
  auto it = t.backends.find(index);
  if (it != t.backends.end()) return *it->second;
  const int visible = logical_gpu_count();
  MIRRORED_ENFORCE(index >= 0 && index < visible, NotFoundError, "GPU:", index, " not found: ", visible,
                   " GPUs are visible");
  const int physical = logical_gpu_location(index).first;
  auto* be = new CudaBackend(Device(DeviceType::GPU, index), physical);
  t.backends.emplace(index, be);
  return *be;
}

CudaBackend& cuda_backend(const Device& device) {
  MIRRORED_ENFORCE(!device.is_host(), InternalError, "cuda_backend: ", device.to_string(), " is not a GPU");
  return cuda_backend(device.index());
}

// ---------------------------------------------------------------------------------------------
// CudaBackend: construction, lanes, events.

CudaBackend::CudaBackend(const Device& logical, int physical)
    : logical_(logical), physical_(physical), allocator_(CudaMemoryPolicy{logical, physical}, cache_limit_from_env()) {
  CudaDeviceGuard guard(physical_, logical_);
  check(cudaStreamCreateWithFlags(&main_.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  try {
    ready_event_ = std::make_unique<CudaEvent>(logical_, physical_, this);
    done_event_ = std::make_unique<CudaEvent>(logical_, physical_, this);
  } catch (...) {
    if (cudaStreamDestroy(main_.stream) != cudaSuccess) (void)cudaGetLastError();
    throw;
  }
  allocator_.set_on_out_of_memory([this] { release_siblings(physical_, this); });
  MIRRORED_LOG(debug, "CUDA backend for ", logical_.short_name(), " on physical GPU ", physical_);
}

CudaBackend::~CudaBackend() = default;

CudaBackend::Lane& CudaBackend::lazy_lane(std::atomic<Lane*>& published, std::unique_ptr<Lane>& owner,
                                          cudaEvent_t* order) {
  if (Lane* lane = published.load(std::memory_order_acquire)) return *lane;
  std::lock_guard lock(lanes_mu_);
  if (owner) return *owner;
  // Everything the lane needs is made first; it is published only once complete, so a failure
  // leaves nothing half-made behind for the next call to trip over.
  CudaDeviceGuard guard(physical_, logical_);
  auto lane = std::make_unique<Lane>();
  check(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaEvent_t event = nullptr;
  if (order) {
    const cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      if (cudaStreamDestroy(lane->stream) != cudaSuccess) (void)cudaGetLastError();
      check(err, "cudaEventCreateWithFlags");
    }
    *order = event;
  }
  owner = std::move(lane);
  published.store(owner.get(), std::memory_order_release);
  return *owner;
}

CudaBackend::Lane& CudaBackend::lane_for_call() {
  if (current_stream() == StreamKind::compute) return main_;
  return lazy_lane(communication_, communication_owner_, nullptr);
}

void CudaBackend::wait_lane(const Lane& lane, const char* what) {
  count_host_sync();
  const Deadline deadline = Deadline::after(default_synchronize_timeout_s());
  wait_cuda_stream(lane.stream, deadline.time_point(), deadline.timeout_seconds(), what, logical_, physical_);
}

void CudaBackend::synchronize_until(const Deadline& deadline) {
  CudaDeviceGuard guard(physical_, logical_);
  count_host_sync();
  Lane& lane = lane_for_call();
  wait_cuda_stream(lane.stream, deadline.time_point(), deadline.timeout_seconds(), "synchronize (cudaStreamQuery)",
                   logical_, physical_);
  raise_division_by_zero(lane);
}

void CudaBackend::wait_keeping_flags(const Deadline& deadline) {
  CudaDeviceGuard guard(physical_, logical_);
  count_host_sync();
  Lane& lane = lane_for_call();
  wait_cuda_stream(lane.stream, deadline.time_point(), deadline.timeout_seconds(),
                   "wait_keeping_flags (cudaStreamQuery)", logical_, physical_);
}

std::unique_ptr<DeviceEvent> CudaBackend::create_event() {
  return std::make_unique<CudaEvent>(logical_, physical_, this);
}

void CudaBackend::record_event(DeviceEvent& event) {
  auto* e = dynamic_cast<CudaEvent*>(&event);
  MIRRORED_ENFORCE(e != nullptr, InternalError, "record_event on ", logical_.short_name(),
                   ": the event was not made by a CUDA backend");
  CudaDeviceGuard guard(physical_, logical_);
  check(cudaEventRecord(e->get(), lane_for_call().stream), "cudaEventRecord");
}

void CudaBackend::wait_event(const DeviceEvent& event) {
  const auto* e = dynamic_cast<const CudaEvent*>(&event);
  MIRRORED_ENFORCE(e != nullptr, InternalError, "wait_event on ", logical_.short_name(),
                   ": the event was not made by a CUDA backend");
  CudaDeviceGuard guard(physical_, logical_);
  check(cudaStreamWaitEvent(lane_for_call().stream, e->get(), 0), "cudaStreamWaitEvent");
}

void CudaBackend::record_stream_use(const void* block, const DeviceBackend& user) {
  const auto* u = dynamic_cast<const CudaBackend*>(&user);
  if (!u) return;  // host work is complete when it returns
  allocator_.record_stream(block, const_cast<CudaBackend*>(u)->stream_for_call());
}

int CudaBackend::max_fused_replicas() const noexcept { return cuda_kernels::kMaxFusedReplicas; }

void CudaBackend::all_reduce_fused(DType dtype, const void* const* in, void* const* out, int n, int64_t count,
                                   int64_t mean_divisor) {
  if (count <= 0) return;
  MIRRORED_ENFORCE(n >= 1 && n <= cuda_kernels::kMaxFusedReplicas, InternalError, "all_reduce_fused on ",
                   logical_.short_name(), " with ", n, " replicas");
  CudaDeviceGuard guard(physical_, logical_);
  check(cuda_kernels::all_reduce_fused(dtype, in, out, n, count, mean_divisor, lane_for_call().stream),
        "all-reduce kernel launch");
}

// ---------------------------------------------------------------------------------------------
// CudaBackend: memory and copies.

void* CudaBackend::allocate(std::size_t bytes) { return allocator_.allocate(bytes, lane_for_call().stream); }

void CudaBackend::deallocate(void* ptr, std::size_t) noexcept { allocator_.deallocate(ptr); }

bool CudaBackend::is_pinned(const void* p) const {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

void CudaBackend::ensure_staging_locked(Lane& lane) {
  if (lane.staging) return;
  // All slots or none: made into locals and published together, so that a failure halfway (a
  // pinned allocation refused) leaves no slot without memory or event for a later call to use.
  Slot made[kSlots];
  try {
    for (auto& s : made) {
      void* p = nullptr;
      check(cudaHostAlloc(&p, kSlotBytes, cudaHostAllocDefault), "cudaHostAlloc");
      s.host = static_cast<unsigned char*>(p);
      check(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    }
  } catch (...) {
    for (auto& s : made) {
      if (s.event && cudaEventDestroy(s.event) != cudaSuccess) (void)cudaGetLastError();
      if (s.host && cudaFreeHost(s.host) != cudaSuccess) (void)cudaGetLastError();
    }
    throw;
  }
  for (int i = 0; i < kSlots; ++i) lane.slots[i] = made[i];
  lane.staging = true;
}

void CudaBackend::wait_slot_locked(Slot& s) {
  if (!s.pending) return;
  const Deadline deadline = Deadline::after(default_synchronize_timeout_s());
  poll_until([&] { return cudaEventQuery(s.event); }, deadline.time_point(), deadline.timeout_seconds(),
             "cudaEventQuery (staging copy)", logical_, physical_);
  s.pending = false;
}

int CudaBackend::next_slot_locked(Lane& lane) {
  lane.slot = (lane.slot + 1) % kSlots;
  lane.used = 0;
  wait_slot_locked(lane.slots[lane.slot]);
  return lane.slot;
}

void CudaBackend::stage_to_device_locked(Lane& lane, void* dst, const void* src, std::size_t bytes) {
  // The host copies chunk k+1 into a slot while the DMA of chunk k runs.
  ensure_staging_locked(lane);
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  std::size_t done = 0;
  while (done < bytes) {
    if (lane.used == kSlotBytes) next_slot_locked(lane);
    Slot& s = lane.slots[lane.slot];
    const std::size_t chunk = std::min(bytes - done, kSlotBytes - lane.used);
    std::memcpy(s.host + lane.used, in + done, chunk);
    check(cudaMemcpyAsync(out + done, s.host + lane.used, chunk, cudaMemcpyHostToDevice, lane.stream),
          "cudaMemcpyAsync");
    check(cudaEventRecord(s.event, lane.stream), "cudaEventRecord");
    s.pending = true;
    lane.used += chunk;
    done += chunk;
  }
}

void CudaBackend::copy_from_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  count_host_to_device(bytes);
  Lane& lane = lane_for_call();
  if (bytes >= kDirectCopyMin && is_pinned(src)) {
    // Already page-locked: one DMA, finished before the caller may reuse `src`.
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, lane.stream), "cudaMemcpyAsync");
    wait_lane(lane, "copy_from_host (cudaStreamQuery)");
    return;
  }
  // Returns once the last chunk is staged: the caller may reuse `src` at once.
  std::lock_guard lock(lane.mu);
  stage_to_device_locked(lane, dst, src, bytes);
}

void CudaBackend::prefetch_from_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  count_host_to_device(bytes);
  Lane& main = lane_for_call();
  Lane& prefetch = lazy_lane(prefetch_, prefetch_owner_, &prefetch_order_);
  std::lock_guard lock(prefetch.mu);
  // The allocator reuses blocks in stream order, so work queued on the calling thread's stream
  // before `dst` was allocated may still touch its memory: the copy waits for exactly that work,
  // not for later.
  check(cudaEventRecord(prefetch_order_, main.stream), "cudaEventRecord");
  check(cudaStreamWaitEvent(prefetch.stream, prefetch_order_, 0), "cudaStreamWaitEvent");
  if (bytes >= kDirectCopyMin && (is_pinned(src) || pin_host_block(src, logical_, physical_))) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, prefetch.stream), "cudaMemcpyAsync");
  } else {
    stage_to_device_locked(prefetch, dst, src, bytes);
  }
  // Complete on return: the consumer uses the tensor on the main stream without further waits.
  wait_lane(prefetch, "prefetch_from_host (cudaStreamQuery)");
}

void CudaBackend::copy_to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  count_device_to_host(bytes);
  Lane& lane = lane_for_call();
  if (bytes >= kDirectCopyMin && is_pinned(dst)) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, lane.stream), "cudaMemcpyAsync");
    wait_lane(lane, "copy_to_host (cudaStreamQuery)");
    return;
  }
  std::lock_guard lock(lane.mu);
  ensure_staging_locked(lane);
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  struct Pending {
    int slot;
    std::size_t offset, length;
  };
  Pending queue[kSlots];
  int head = 0, count = 0;
  std::size_t issued = 0;
  while (issued < bytes || count > 0) {
    // Keep up to kSlots chunks in flight; slots are taken in ring order, so the next one is
    // never one of those still queued.
    while (issued < bytes && count < kSlots) {
      const int s = next_slot_locked(lane);
      // Full at once: should this copy fail or time out, a later staged upload must not write
      // into a slot whose download may still be pending (next_slot_locked left it empty).
      lane.used = kSlotBytes;
      const std::size_t len = std::min(kSlotBytes, bytes - issued);
      check(cudaMemcpyAsync(lane.slots[s].host, in + issued, len, cudaMemcpyDeviceToHost, lane.stream),
            "cudaMemcpyAsync");
      check(cudaEventRecord(lane.slots[s].event, lane.stream), "cudaEventRecord");
      lane.slots[s].pending = true;
      queue[(head + count) % kSlots] = Pending{s, issued, len};
      ++count;
      issued += len;
    }
    const Pending p = queue[head];
    head = (head + 1) % kSlots;
    --count;
    wait_slot_locked(lane.slots[p.slot]);
    std::memcpy(out + p.offset, lane.slots[p.slot].host, p.length);
  }
  lane.used = kSlotBytes;  // host-to-device copies continue in a fresh slot
}

void CudaBackend::copy_within(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  CudaDeviceGuard guard(physical_, logical_);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, lane_for_call().stream), "cudaMemcpyAsync");
}

void CudaBackend::copy_rows_within(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                                   std::size_t width, std::size_t height) {
  if (width == 0 || height == 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice,
                          lane_for_call().stream),
        "cudaMemcpy2DAsync");
}

}  // namespace mirrored::detail
