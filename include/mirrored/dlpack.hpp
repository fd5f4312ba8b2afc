#pragma once
/// \file
/// DLPack interop (`to_dlpack`, `Tensor<T>::from_dlpack`): tensors exchanged with other frameworks
/// (PyTorch, JAX, CuPy, NumPy, …) without a copy. Include it explicitly: it needs DLPack's header
/// `<dlpack/dlpack.h>` (DLPack 0.6 or later; Debian's `libdlpack-dev`, CMake target
/// `mirrored::dlpack`); the core headers and the compiled library do not.
///
/// Mapping. Devices: host memory (`kDLCPU`, and `kDLCUDAHost`, CUDA's pinned host memory) is a
/// `CPU:k` tensor; `kDLCUDA` device `n` is the GPU whose CUDA ordinal is `n` (`GPU:n` unless a GPU
/// is split into logical GPUs). Dtypes: float32 ↔ {kDLFloat, 32, 1}, float64 ↔ {kDLFloat, 64, 1},
/// int32 ↔ {kDLInt, 32, 1}, int64 ↔ {kDLInt, 64, 1}, uint8 ↔ {kDLUInt, 8, 1},
/// float16 ↔ {kDLFloat, 16, 1}, bfloat16 ↔ {kDLBfloat, 16, 1}.
///
/// Ordering. DLPack 0.6 has no way to say which stream the data is ready on: `to_dlpack` waits for
/// the calling thread's work on the tensor's device, and `from_dlpack` expects the producer to have
/// done the same.

#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/dlpack_devices.hpp"
#include "mirrored/detail/format.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/device.hpp"
#include "mirrored/dtype.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/tensor.hpp"

#if !defined(DLPACK_VERSION) || DLPACK_VERSION < 60
#error "mirrored/dlpack.hpp needs DLPack 0.6 or later (DLPACK_VERSION >= 60)"
#endif

namespace mirrored {

namespace detail {

/// DLPack's dtype of `dtype`; none for a dtype DLPack 0.6 cannot describe.
inline std::optional<DLDataType> dlpack_dtype(DType dtype) noexcept {
  if (dtype == DType::float32) return DLDataType{kDLFloat, 32, 1};
  if (dtype == DType::float64) return DLDataType{kDLFloat, 64, 1};
  if (dtype == DType::int32) return DLDataType{kDLInt, 32, 1};
  if (dtype == DType::int64) return DLDataType{kDLInt, 64, 1};
  if (dtype == DType::uint8) return DLDataType{kDLUInt, 8, 1};
  if (dtype == DType::float16) return DLDataType{kDLFloat, 16, 1};
  if (dtype == DType::bfloat16) return DLDataType{kDLBfloat, 16, 1};
  return std::nullopt;
}

/// `{code 2 (kDLFloat), bits 32, lanes 1}`, followed by ` = float32` when this library has it.
inline std::string describe_dlpack_dtype(const DLDataType& t) {
  static const char* const kCodes[] = {"kDLInt", "kDLUInt", "kDLFloat", "kDLOpaqueHandle", "kDLBfloat", "kDLComplex"};
  std::string out = str_cat("{code ", unsigned{t.code});
  if (t.code < sizeof(kCodes) / sizeof(kCodes[0])) out += str_cat(" (", kCodes[t.code], ")");
  out += str_cat(", bits ", unsigned{t.bits}, ", lanes ", unsigned{t.lanes}, "}");
  for (DType d :
       {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8, DType::float16, DType::bfloat16}) {
    const auto m = dlpack_dtype(d);
    if (m->code == t.code && m->bits == t.bits && m->lanes == t.lanes) return out + " = " + dtype_name(d);
  }
  return out;
}

/// The device type as the int it is stored as: a producer may send a type newer than this header
/// knows, which is no valid value of the enum (reading it as the enum would be undefined).
inline int dlpack_device_type(const DLDevice& d) noexcept {
  static_assert(sizeof(d.device_type) == sizeof(int));
  int type = 0;
  std::memcpy(&type, &d.device_type, sizeof(type));
  return type;
}

/// `kDLCUDA:1` (or the number of a device type this library does not know).
inline std::string describe_dlpack_device(const DLDevice& d) {
  const char* name = nullptr;
  const int type = dlpack_device_type(d);
  switch (type) {
    case kDLCPU: name = "kDLCPU"; break;
    case kDLCUDA: name = "kDLCUDA"; break;
    case kDLCUDAHost: name = "kDLCUDAHost"; break;
    case kDLOpenCL: name = "kDLOpenCL"; break;
    case kDLVulkan: name = "kDLVulkan"; break;
    case kDLMetal: name = "kDLMetal"; break;
    case kDLVPI: name = "kDLVPI"; break;
    case kDLROCM: name = "kDLROCM"; break;
    case kDLROCMHost: name = "kDLROCMHost"; break;
    case kDLExtDev: name = "kDLExtDev"; break;
    case kDLCUDAManaged: name = "kDLCUDAManaged"; break;
    default: break;
  }
  return name ? str_cat(name, ":", d.device_id) : str_cat("device type ", type, ":", d.device_id);
}

/// `[2, 3]` (for strides in messages).
inline std::string format_int64s(const int64_t* values, int n) {
  std::string out = "[";
  for (int i = 0; i < n; ++i) out += str_cat(i ? ", " : "", values[i]);
  return out + "]";
}

/// The strides (in elements) of a compact row-major array of `shape`.
inline std::vector<int64_t> compact_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

/// What `to_dlpack` hands out: the DLManagedTensor, the shape and strides it points to, and a handle
/// on the tensor's storage that keeps the memory alive until the consumer calls the deleter.
struct DLPackExport {
  DLManagedTensor managed{};
  UntypedTensor tensor;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;

  static void deleter(DLManagedTensor* self) noexcept { delete static_cast<DLPackExport*>(self->manager_ctx); }
};

}  // namespace detail

/// Hands `t`'s memory to a DLPack consumer without a copy: a new `DLManagedTensor` whose `dl_tensor`
/// describes `t` (compact row-major, with explicit strides, `byte_offset` 0; host tensors are
/// `kDLCPU` device 0, GPU tensors `kDLCUDA` with their CUDA ordinal). It holds a handle on `t`'s
/// storage: the memory stays valid, and shared with `t` and its copies, until the consumer calls
/// `managed->deleter(managed)`, which it must do exactly once. For a GPU tensor it first waits for
/// the calling thread's work on the GPU, so the consumer sees the values.
/// \throws InvalidArgumentError for an element type DLPack cannot describe; what a failed wait on
/// the GPU throws.
template <class T>
DLManagedTensor* to_dlpack(const Tensor<T>& t) {
  const auto dtype = detail::dlpack_dtype(t.dtype());
  MIRRORED_ENFORCE(dtype.has_value(), InvalidArgumentError, "to_dlpack: a Tensor<", dtype_name(t.dtype()),
                   "> has no DLPack dtype");
  DLDevice device{kDLCPU, 0};
  if (!t.device().is_host()) {
    device = DLDevice{kDLCUDA, detail::dlpack_cuda_ordinal(t.device())};
    detail::backend_for(t.device()).synchronize();
  }
  auto out = std::make_unique<detail::DLPackExport>();
  out->tensor = detail::TensorAccess::erase(t);
  out->shape.assign(t.shape().begin(), t.shape().end());
  out->strides = detail::compact_strides(t.shape());
  DLTensor& dl = out->managed.dl_tensor;
  dl.data = out->tensor.data();
  dl.device = device;
  dl.ndim = static_cast<int>(out->shape.size());
  dl.dtype = *dtype;
  dl.shape = out->shape.data();
  dl.strides = out->strides.data();
  dl.byte_offset = 0;
  out->managed.manager_ctx = out.get();
  out->managed.deleter = &detail::DLPackExport::deleter;
  return &out.release()->managed;
}

/// A tensor sharing the memory of the DLPack tensor `managed` (no copy). It takes over `managed`:
/// when the last handle on the tensor's storage goes (the tensor, its copies, reshapes, collective
/// results that alias it, …), `managed->deleter(managed)` is called exactly once (not when it is
/// null), on the thread that drops that handle, after that thread's work queued on the device has
/// finished.
///
/// `device` says which device of this library the memory is attributed to: for host memory
/// (`kDLCPU`, `kDLCUDAHost`, whatever their `device_id`) a `CPU:k` (default `CPU:0`); for `kDLCUDA`
/// device `n` a logical GPU on the GPU with CUDA ordinal `n` (default: the first one). The memory
/// must be compact row-major: `strides` null, or equal to the compact strides wherever a dimension
/// has more than one element. `byte_offset` is added to `data`. The producer must have finished
/// writing it (DLPack 0.6 has no stream to order on).
///
/// \throws InvalidArgumentError naming the op and both sides, for: a null `managed`; a `T` DLPack
/// 0.6 cannot describe; a dtype (code, bits, lanes) other than `T`'s; a device type other than
/// kDLCPU, kDLCUDA, kDLCUDAHost; a GPU this process does not have; a `device` that does not match
/// the memory's; a negative `ndim` or dimension, a null shape, an element count that overflows;
/// strides that are not compact row-major; data null with elements, or not aligned for `T` after
/// `byte_offset`. On a refusal `managed` is left untouched and its deleter is **not** called: the
/// caller still owns it.
template <class T>
Tensor<T> Tensor<T>::from_dlpack(DLManagedTensor* managed, std::optional<Device> device) {
  const std::string op = detail::str_cat("Tensor<", dtype_name(dtype()), ">::from_dlpack");
  MIRRORED_ENFORCE(managed != nullptr, InvalidArgumentError, op, ": the DLManagedTensor is null");
  const DLTensor& dl = managed->dl_tensor;

  const std::optional<DLDataType> mapped = detail::dlpack_dtype(dtype());
  MIRRORED_ENFORCE(mapped.has_value(), InvalidArgumentError, op, ": a Tensor<", dtype_name(dtype()),
                   "> has no DLPack dtype");
  const DLDataType want = *mapped;
  MIRRORED_ENFORCE(dl.dtype.code == want.code && dl.dtype.bits == want.bits && dl.dtype.lanes == want.lanes,
                   InvalidArgumentError, op, ": the DLPack tensor's dtype ", detail::describe_dlpack_dtype(dl.dtype),
                   " is not the dtype of a Tensor<", dtype_name(dtype()), "> ", detail::describe_dlpack_dtype(want));

  Device where;
  const std::string dl_device = detail::describe_dlpack_device(dl.device);
  switch (detail::dlpack_device_type(dl.device)) {
    case kDLCPU:
    case kDLCUDAHost:
      where = device.value_or(cpu0);
      MIRRORED_ENFORCE(where.is_host(), InvalidArgumentError, op, ": the DLPack tensor is in host memory (", dl_device,
                       "), which cannot be a tensor on ", where.short_name());
      break;
    case kDLCUDA: {
      const std::optional<Device> gpu =
          dl.device.device_id >= 0 ? detail::dlpack_gpu_of_ordinal(dl.device.device_id) : std::nullopt;
      MIRRORED_ENFORCE(gpu.has_value(), InvalidArgumentError, op, ": the DLPack tensor is on ", dl_device,
                       ", a GPU this process does not have (it has ", detail::dlpack_gpu_count(), " GPUs)");
      where = *gpu;
      if (device) {
        MIRRORED_ENFORCE(
            !device->is_host() && device_exists(*device) && detail::dlpack_cuda_ordinal(*device) == dl.device.device_id,
            InvalidArgumentError, op, ": the DLPack tensor is on ", dl_device, ", which cannot be a tensor on ",
            device->short_name());
        where = *device;
      }
      break;
    }
    default:
      throw InvalidArgumentError(
          detail::str_cat(op, ": the DLPack tensor is on ", dl_device,
                          ", a device type this library does not support (it takes kDLCPU, kDLCUDA, "
                          "kDLCUDAHost) for a tensor on ",
                          device ? device->short_name() : std::string("a CPU or GPU")));
  }

  MIRRORED_ENFORCE(dl.ndim >= 0 && (dl.ndim == 0 || dl.shape != nullptr), InvalidArgumentError, op,
                   ": the DLPack tensor has ndim ", dl.ndim, " and ", dl.shape ? "a" : "a null", " shape");
  Shape shape(dl.shape, dl.shape + dl.ndim);
  int64_t numel = 0;
  try {
    numel = detail::shape_numel(shape, sizeof(T));
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(detail::str_cat(op, ": ", e.what()));
  }

  if (dl.strides != nullptr && numel > 0) {
    const std::vector<int64_t> compact = detail::compact_strides(shape);
    for (int i = 0; i < dl.ndim; ++i)
      MIRRORED_ENFORCE(shape[i] == 1 || dl.strides[i] == compact[i], InvalidArgumentError, op,
                       ": the DLPack tensor is not compact row-major: shape ", detail::format_int64s(dl.shape, dl.ndim),
                       " with strides ", detail::format_int64s(dl.strides, dl.ndim), ", a Tensor needs strides ",
                       detail::format_int64s(compact.data(), dl.ndim));
  }

  void* data = dl.data ? static_cast<unsigned char*>(dl.data) + dl.byte_offset : nullptr;
  MIRRORED_ENFORCE(data != nullptr || numel == 0, InvalidArgumentError, op, ": the DLPack tensor's data is null but ",
                   "its shape ", detail::format_int64s(dl.shape, dl.ndim), " has ", numel, " elements");
  MIRRORED_ENFORCE(reinterpret_cast<std::uintptr_t>(data) % alignof(T) == 0, InvalidArgumentError, op,
                   ": the DLPack tensor's data + byte_offset (", dl.byte_offset, ") is not aligned to the ", alignof(T),
                   " bytes of a ", dtype_name(dtype()));

  const detail::Storage::Release release = [](void* context) noexcept {
    auto* self = static_cast<DLManagedTensor*>(context);
    if (self->deleter) self->deleter(self);
  };
  detail::UntypedTensor u;
  u.dtype = dtype();
  u.shape = std::move(shape);
  u.numel = numel;
  u.storage = std::make_shared<detail::Storage>(where, data, static_cast<std::size_t>(numel) * sizeof(T), release,
                                                static_cast<void*>(managed));
  return detail::TensorAccess::restore<T>(u);
}

}  // namespace mirrored
