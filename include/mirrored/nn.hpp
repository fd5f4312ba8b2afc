#pragma once
/// \file
/// Loss helpers for distributed training (TF's `tf.nn.compute_average_loss`).

#include <cstdint>
#include <optional>

#include "mirrored/detail/device_backend.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/replica_context.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored::nn {

/// The sum of `per_example_loss` divided by `global_batch_size`, as a rank-0 tensor on the loss's
/// device. Summed over replicas (the SUM all-reduce of gradients), this is the mean loss of the
/// global batch however it was split. Without `global_batch_size` it is this replica's batch
/// (dimension 0) times `num_replicas_in_sync` of the current replica context.
/// \throws InvalidArgumentError for a rank-0 loss or a non-positive batch size.
template <class T>
Tensor<T> compute_average_loss(const Tensor<T>& per_example_loss,
                               std::optional<int64_t> global_batch_size = std::nullopt) {
  static_assert(is_floating_element_v<T>, "compute_average_loss needs a floating-point loss");
  MIRRORED_ENFORCE(per_example_loss.rank() >= 1, InvalidArgumentError,
                   "compute_average_loss: Invalid value passed for `per_example_loss`. Expected a tensor with at "
                   "least rank 1, got shape ",
                   detail::format_shape(per_example_loss.shape()));
  int64_t global = 0;
  if (global_batch_size) {
    global = *global_batch_size;
  } else {
    ReplicaContext* ctx = get_replica_context();
    global = per_example_loss.shape()[0] * (ctx ? ctx->num_replicas_in_sync() : 1);
  }
  MIRRORED_ENFORCE(global > 0, InvalidArgumentError, "compute_average_loss: global_batch_size must be positive, got ",
                   global);
  // Summed in index order (deterministic), in double, then divided once, on the loss's device: a
  // GPU replica's loss never makes a round trip through the host.
  const Device& device = per_example_loss.device();
  const Tensor<double> wide = cast<double>(per_example_loss);
  Tensor<double> sum = Tensor<double>::empty({}, device);
  detail::DeviceBackend& backend = detail::backend_for(device);
  backend.sum_axis(DType::float64, wide.data(), 1, wide.numel(), 1, sum.data());
  backend.divide(DType::float64, sum.data(), 1, global);
  return cast<T>(sum);
}

}  // namespace mirrored::nn
