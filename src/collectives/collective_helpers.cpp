#include "collectives/collective_helpers.hpp"

#include <cstring>
#include <memory>

#include "collectives/stream_copy.hpp"
#include "device/placement.hpp"
#include "mirrored/detail/balanced_split.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/format.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail {

void sum_parts_on(const std::vector<const UntypedTensor*>& parts, const UntypedTensor& out, const Device& device,
                  int64_t mean_divisor) {
  sum_range_on(parts, 0, out, device, mean_divisor);
}

void sum_range_on(const std::vector<const UntypedTensor*>& parts, int64_t begin, const UntypedTensor& out,
                  const Device& device, int64_t mean_divisor) {
  if (out.numel == 0) return;
  const std::size_t offset = static_cast<std::size_t>(begin) * dtype_size(out.dtype);
  std::vector<UntypedTensor> staged;
  staged.reserve(parts.size());
  std::vector<const void*> ptrs;
  ptrs.reserve(parts.size());
  for (const UntypedTensor* t : parts) {
    const auto* first = static_cast<const unsigned char*>(t->data()) + offset;
    if (same_memory(t->device(), device)) {
      // Work that produced it is ordered on its own device's stream: the sum waits for it there,
      // the host does not.
      if (!same_backend(t->device(), device)) {
        DeviceBackend& producer = backend_for(t->device());
        const std::unique_ptr<DeviceEvent> produced = producer.create_event();
        producer.record_event(*produced);
        backend_for(device).wait_event(*produced);
      }
      ptrs.push_back(first);
    } else {
      staged.push_back(make_untyped(out.dtype, {out.numel}, device));
      copy_between(staged.back().data(), device, first, t->device(), out.bytes());
      ptrs.push_back(staged.back().data());
    }
  }
  const bool out_here = same_backend(out.device(), device);
  const UntypedTensor target = out_here ? out : make_untyped(out.dtype, out.shape, device);
  auto& be = backend_for(device);
  be.sum_n_mean(out.dtype, ptrs.data(), static_cast<int>(ptrs.size()), target.data(), out.numel, mean_divisor);
  // The sum is complete on return, as it was before the host waits came out of the hot paths: an
  // asynchronous all-reduce runs this on the summing replica's communication stream, and the other
  // replicas order their reads after their own streams only, so "ordered on its stream" was not
  // enough (simulated GPUs: an asynchronous MEAN read zeros).
  // Parts read in place from another logical GPU are no longer read after this wait either, so
  // their owners may free them at once.
  be.synchronize();
  // An output elsewhere is copied there.
  if (!out_here) copy_between(out.data(), out.device(), target.data(), device, out.bytes());
}

Shape reduce_scatter_piece(const UntypedTensor& in, int replica, int num_replicas, std::vector<int64_t>& split) {
  MIRRORED_ENFORCE(
      !in.shape.empty(), InvalidArgumentError, "reduce_scatter on replica ", replica,
      ": a rank-0 value has no rows to scatter; reduce_scatter needs rank >= 1 (reshape it to (1,) first)");
  const int64_t rows = in.shape[0];
  const int64_t row = rows == 0 ? 0 : in.numel / rows;
  split.clear();
  for (int r = 0; r < num_replicas; ++r) split.push_back(balanced_piece(rows, num_replicas, r).count * row);
  Shape shape = in.shape;
  shape[0] = balanced_piece(rows, num_replicas, replica).count;
  return shape;
}

int64_t split_begin(const std::vector<int64_t>& split, int r) noexcept {
  int64_t begin = 0;
  for (int q = 0; q < r; ++q) begin += split[static_cast<std::size_t>(q)];
  return begin;
}

void all_reduce_via_first(ReduceOp op, CollectiveStep& step, const std::vector<std::size_t>& leaves,
                          const std::optional<Device>& on) {
  const int n = step.num_replicas();
  const int me = step.replica();
  if (me == 0) {
    for (std::size_t i : leaves) {
      std::vector<const UntypedTensor*> parts;
      for (int r = 0; r < n; ++r) parts.push_back(&step.inputs(r)[i]);
      const UntypedTensor& out = step.outputs(0)[i];
      sum_parts_on(parts, out, on.value_or(out.device()), op == ReduceOp::MEAN ? n : 0);
    }
  }
  step.sync();
  if (me != 0) {
    for (std::size_t i : leaves) {
      const UntypedTensor& mine = step.outputs(me)[i];
      const UntypedTensor& first = step.outputs(0)[i];
      copy_between(mine.data(), mine.device(), first.data(), first.device(), mine.bytes());
    }
  }
}

void gather_into_own_outputs(int axis, CollectiveStep& step) {
  const auto& outs = step.outputs(step.replica());
  for (std::size_t i = 0; i < outs.size(); ++i) {
    std::vector<const UntypedTensor*> parts;
    for (int r = 0; r < step.num_replicas(); ++r) parts.push_back(&step.inputs(r)[i]);
    concat_into(parts, axis, outs[i]);
  }
}

Shape concat_shape(const char* op, const std::vector<const Shape*>& shapes, int& axis) {
  const Shape& first = *shapes[0];
  for (std::size_t r = 0; r < shapes.size(); ++r) {
    const Shape& s = *shapes[r];
    MIRRORED_ENFORCE(!s.empty(), InvalidArgumentError, op, ": replica ", r, " passed a rank-0 value; ", op,
                     " needs rank >= 1 (reshape it to (1,) first)");
    MIRRORED_ENFORCE(s.size() == first.size(), InvalidArgumentError, op, ": ranks differ: replica 0 passed shape ",
                     format_shape(first), " and replica ", r, " passed shape ", format_shape(s));
  }
  const int64_t rank = static_cast<int64_t>(first.size());
  MIRRORED_ENFORCE(axis >= -rank && axis < rank, InvalidArgumentError, "`axis` = ", axis,
                   " out of range for `value` with rank ", rank);
  if (axis < 0) axis = static_cast<int>(axis + rank);
  Shape out = first;
  out[axis] = 0;
  for (std::size_t r = 0; r < shapes.size(); ++r) {
    const Shape& s = *shapes[r];
    for (int64_t d = 0; d < rank; ++d) {
      MIRRORED_ENFORCE(d == axis || s[d] == first[d], InvalidArgumentError, op, ": shapes may differ only along axis ",
                       axis, ": replica 0 passed shape ", format_shape(first), " and replica ", r, " passed shape ",
                       format_shape(s));
    }
    out[axis] += s[axis];
  }
  return out;
}

void concat_into(const std::vector<const UntypedTensor*>& parts, int axis, const UntypedTensor& out,
                 const Parallel& parallel) {
  const std::size_t elem = dtype_size(out.dtype);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= out.shape[d];
  for (std::size_t d = axis + 1; d < out.shape.size(); ++d) inner *= out.shape[d];
  const int64_t out_row = out.shape[axis] * inner;
  auto* dst = static_cast<unsigned char*>(out.data());
  // Below this the hand-out to the replica threads (a few microseconds) costs more than it saves.
  constexpr std::size_t kParallelMinBytes = std::size_t{1} << 20;
  bool host = out.device().is_host();
  for (const UntypedTensor* p : parts) host = host && p->device().is_host();
  if (outer == 1 && host && parallel && out.bytes() >= kParallelMinBytes) {
    std::vector<std::size_t> offsets;  // where each part goes, in bytes
    std::size_t at = 0;
    for (const UntypedTensor* p : parts) {
      offsets.push_back(at);
      at += p->bytes();
    }
    // Part k of the work copies every part whose index is k modulo the number of parts; a result
    // too large to stay cached is written around the cache (one write instead of a read for
    // ownership and a write).
    const bool streaming = out.bytes() >= kStreamMinBytes;
    const bool done = parallel([&](int k, int num) {
      for (std::size_t i = static_cast<std::size_t>(k); i < parts.size(); i += static_cast<std::size_t>(num)) {
        if (streaming)
          stream_copy(dst + offsets[i], parts[i]->data(), parts[i]->bytes());
        else
          std::memcpy(dst + offsets[i], parts[i]->data(), parts[i]->bytes());
      }
      if (streaming) stream_fence();
    });
    if (done) return;
  }
  DeviceBackend* strided = nullptr;  // set once a part was copied on the output's stream
  int64_t offset = 0;
  for (const UntypedTensor* p : parts) {
    const int64_t row = p->shape[axis] * inner;
    if (row == 0) continue;
    if (outer == 1) {
      copy_between(dst + offset * static_cast<int64_t>(elem), out.device(), p->data(), p->device(), p->bytes());
      // A copy within the device is ordered on its stream: waited for below, like the strided ones.
      if (same_backend(p->device(), out.device())) strided = &backend_for(out.device());
    } else {
      // One strided copy per part on the output's device (a part from elsewhere is brought there
      // first), instead of one copy per outer index.
      const UntypedTensor* local = p;
      UntypedTensor staged;
      if (!same_backend(p->device(), out.device())) {
        staged = make_untyped(p->dtype, p->shape, out.device());
        copy_between(staged.data(), out.device(), p->data(), p->device(), p->bytes());
        local = &staged;
      }
      strided = &backend_for(out.device());
      strided->copy_rows_within(dst + offset * static_cast<int64_t>(elem), static_cast<std::size_t>(out_row) * elem,
                                local->data(), static_cast<std::size_t>(row) * elem,
                                static_cast<std::size_t>(row) * elem, static_cast<std::size_t>(outer));
    }
    offset += row;
  }
  if (strided) strided->synchronize();  // complete on return, like copy_between
}

}  // namespace mirrored::detail
