// The CUDA device backend: one per logical GPU, each with its own stream, caching allocator and
// pinned staging buffers; kernels in kernels.cu.
#include "cuda/cuda_backend.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <vector>

#include "cuda/kernels.hpp"
#include "gpu/logical_gpus.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/replica_context.hpp"
#include "util/log.hpp"

namespace mirrored::detail {

// ---------------------------------------------------------------------------------------------
// Errors and device guards.

std::string describe_gpu_call_site(const Device& logical, int physical) {
  std::string where = logical.short_name() + " (physical GPU " + std::to_string(physical) + ")";
  if (const ReplicaContext* ctx = thread_state().replica)
    where += ", replica " + std::to_string(ctx->replica_id_in_sync_group());
  return where;
}

void throw_cuda_error(cudaError_t err, const char* call, const Device& logical, int physical) {
  (void)cudaGetLastError();  // clear a non-sticky error so that later calls start clean
  const std::string message = str_cat(call, " failed on ", describe_gpu_call_site(logical, physical), ": ",
                                      cudaGetErrorName(err), ": ", cudaGetErrorString(err));
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
// CudaBackend.

CudaBackend::CudaBackend(const Device& logical, int physical)
    : logical_(logical), physical_(physical), allocator_(CudaMemoryPolicy{logical, physical}, cache_limit_from_env()) {
  CudaDeviceGuard guard(physical_, logical_);
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  main_.stream = stream_;
  check(cudaEventCreateWithFlags(&ready_event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check(cudaEventCreateWithFlags(&done_event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  allocator_.set_on_out_of_memory([this] { release_siblings(physical_, this); });
  MIRRORED_LOG(debug, "CUDA backend for ", logical_.short_name(), " on physical GPU ", physical_);
}

CudaBackend::~CudaBackend() = default;

void* CudaBackend::allocate(std::size_t bytes) { return allocator_.allocate(bytes); }

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
  if (lane.slots[0].host) return;
  for (auto& s : lane.slots) {
    void* p = nullptr;
    check(cudaHostAlloc(&p, kSlotBytes, cudaHostAllocDefault), "cudaHostAlloc");
    s.host = static_cast<unsigned char*>(p);
    check(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
}

void CudaBackend::wait_slot_locked(Slot& s) {
  if (!s.pending) return;
  check(cudaEventSynchronize(s.event), "cudaEventSynchronize");
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
  if (bytes >= kDirectCopyMin && is_pinned(src)) {
    // Already page-locked: one DMA, finished before the caller may reuse `src`.
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return;
  }
  // Returns once the last chunk is staged: the caller may reuse `src` at once.
  std::lock_guard lock(main_.mu);
  stage_to_device_locked(main_, dst, src, bytes);
}

void CudaBackend::prefetch_from_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  std::lock_guard lock(prefetch_.mu);
  if (!prefetch_.stream) {
    check(cudaStreamCreateWithFlags(&prefetch_.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaEventCreateWithFlags(&prefetch_order_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
  // The allocator reuses blocks in main-stream order, so work queued there before `dst` was
  // allocated may still touch its memory: the copy waits for exactly that work, not for later.
  check(cudaEventRecord(prefetch_order_, stream_), "cudaEventRecord");
  check(cudaStreamWaitEvent(prefetch_.stream, prefetch_order_, 0), "cudaStreamWaitEvent");
  if (bytes >= kDirectCopyMin && (is_pinned(src) || pin_host_block(src, logical_, physical_))) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, prefetch_.stream), "cudaMemcpyAsync");
  } else {
    stage_to_device_locked(prefetch_, dst, src, bytes);
  }
  // Complete on return: the consumer uses the tensor on the main stream without further waits.
  check(cudaStreamSynchronize(prefetch_.stream), "cudaStreamSynchronize");
}

void CudaBackend::copy_to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  if (bytes >= kDirectCopyMin && is_pinned(dst)) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return;
  }
  std::lock_guard lock(main_.mu);
  ensure_staging_locked(main_);
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
      const int s = next_slot_locked(main_);
      const std::size_t len = std::min(kSlotBytes, bytes - issued);
      check(cudaMemcpyAsync(main_.slots[s].host, in + issued, len, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
      check(cudaEventRecord(main_.slots[s].event, stream_), "cudaEventRecord");
      main_.slots[s].pending = true;
      queue[(head + count) % kSlots] = Pending{s, issued, len};
      ++count;
      issued += len;
    }
    const Pending p = queue[head];
    head = (head + 1) % kSlots;
    --count;
    wait_slot_locked(main_.slots[p.slot]);
    std::memcpy(out + p.offset, main_.slots[p.slot].host, p.length);
  }
  main_.used = kSlotBytes;  // host-to-device copies continue in a fresh slot
}

void CudaBackend::copy_within(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  CudaDeviceGuard guard(physical_, logical_);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
}

void CudaBackend::copy_rows_within(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                                   std::size_t width, std::size_t height) {
  if (width == 0 || height == 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpy2DAsync");
}

void CudaBackend::fill(DType dtype, void* dst, int64_t count, const void* value) {
  if (count <= 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  check(cuda_kernels::fill(dtype, dst, count, value, stream_), "fill kernel launch");
}

void CudaBackend::binary(BinaryOp op, DType dtype, const void* a, bool a_scalar, const void* b, bool b_scalar,
                         void* out, int64_t count) {
  if (count <= 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  const auto kop = static_cast<cuda_kernels::Binary>(static_cast<int>(op));
  if (op != BinaryOp::div || dtype_is_floating(dtype)) {
    check(cuda_kernels::binary(kop, dtype, a, a_scalar, b, b_scalar, out, count, nullptr, stream_),
          "binary kernel launch");
    return;
  }
  // Integer division: the kernel records the first zero divisor; raise it like the host does.
  std::lock_guard lock(div_mu_);
  if (!div_flag_) {
    void* d = nullptr;
    check(cudaMalloc(&d, sizeof(unsigned long long)), "cudaMalloc");
    div_flag_ = static_cast<unsigned long long*>(d);
    void* h = nullptr;
    check(cudaHostAlloc(&h, sizeof(unsigned long long), cudaHostAllocDefault), "cudaHostAlloc");
    div_flag_host_ = static_cast<unsigned long long*>(h);
    check(cudaMemsetAsync(div_flag_, 0xFF, sizeof(unsigned long long), stream_), "cudaMemsetAsync");
  }
  check(cuda_kernels::binary(kop, dtype, a, a_scalar, b, b_scalar, out, count, div_flag_, stream_),
        "div kernel launch");
  check(cudaMemcpyAsync(div_flag_host_, div_flag_, sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  const unsigned long long at = *div_flag_host_;
  if (at != std::numeric_limits<unsigned long long>::max()) {
    check(cudaMemsetAsync(div_flag_, 0xFF, sizeof(unsigned long long), stream_), "cudaMemsetAsync");
    throw InvalidArgumentError(str_cat("div: integer division by zero at element ", at));
  }
}

void CudaBackend::sum_n(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count) {
  if (count <= 0) return;
  MIRRORED_ENFORCE(num_inputs >= 1, InternalError, "sum_n on ", logical_.short_name(), " with ", num_inputs, " inputs");
  CudaDeviceGuard guard(physical_, logical_);
  constexpr int kMax = cuda_kernels::kMaxSumInputs;
  if (num_inputs <= kMax) {
    check(cuda_kernels::sum_n(dtype, inputs, num_inputs, nullptr, out, count, stream_), "sum_n kernel launch");
    return;
  }
  // More inputs than one launch takes: accumulate into scratch, in order; the last launch writes
  // `out` (which may alias an input, so it is written only once every input has been read).
  const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
  void* scratch = allocator_.allocate(bytes);
  struct Release {
    CachingAllocator<CudaMemoryPolicy>& a;
    void* p;
    ~Release() { a.deallocate(p); }  // stream-ordered: later users of the block come after
  } release{allocator_, scratch};
  check(cuda_kernels::sum_n(dtype, inputs, kMax, nullptr, scratch, count, stream_), "sum_n kernel launch");
  int next = kMax;
  while (num_inputs - next > kMax) {
    check(cuda_kernels::sum_n(dtype, inputs + next, kMax, scratch, scratch, count, stream_), "sum_n kernel launch");
    next += kMax;
  }
  check(cuda_kernels::sum_n(dtype, inputs + next, num_inputs - next, scratch, out, count, stream_),
        "sum_n kernel launch");
}

void CudaBackend::sum_axis(DType dtype, const void* in, int64_t outer, int64_t length, int64_t inner, void* out) {
  if (outer * inner <= 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  check(cuda_kernels::sum_axis(dtype, in, outer, length, inner, out, stream_), "sum_axis kernel launch");
}

void CudaBackend::divide(DType dtype, void* inout, int64_t count, int64_t divisor) {
  if (!dtype_is_floating(dtype))
    MIRRORED_ENFORCE(divisor != 0, InvalidArgumentError, "divide: integer division by zero");
  if (count <= 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  check(cuda_kernels::divide(dtype, inout, count, divisor, stream_), "divide kernel launch");
}

void CudaBackend::cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t count) {
  if (count <= 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  check(cuda_kernels::cast(src_dtype, src, dst_dtype, dst, count, stream_), "cast kernel launch");
}

void CudaBackend::synchronize() { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

}  // namespace mirrored::detail
