#pragma once
/// \file
/// Internal: the split rules of `experimental_distribute_dataset` (compiled in
/// src/data/rebatch.cpp).
/// Needed by `RebatchSource<E>` of `experimental_distribute_dataset` (step_sources.hpp).

#include <cstdint>
#include <utility>
#include <vector>

#include "mirrored/input_options.hpp"

namespace mirrored::data::detail {

/// Rows `[first, second)` of a batch.
using RowRange = std::pair<int64_t, int64_t>;

/// TF's `batch_sizes_for_worker(global_batch_size, num_workers, num_replicas_per_worker,
/// worker_index)`: the sizes of worker `worker_index`'s replicas' slices of a full global batch,
/// where the N = W*R slices of the whole batch have `floor = G / N` rows each and the first
/// `G - N*floor` (in global replica order) one more.
/// \throws InvalidArgumentError for a negative size, counts < 1 or an index out of range.
std::vector<int64_t> batch_sizes_for_worker(int64_t global_batch_size, int num_workers, int num_replicas_per_worker,
                                            int worker_index);

/// The N = `num_slices` row ranges a batch of `rows` rows is cut into, in global replica order.
/// BALANCED: `floor = rows / N` rows each and one more for the first `rows - N*floor` slices,
/// for every batch, full or partial (for a full batch, `batch_sizes_for_worker`).
/// CEIL: `ceil(rows / N)` rows per slice, clipped to the batch.
std::vector<RowRange> split_rows(RebatchPolicy policy, int64_t rows, int num_slices);

}  // namespace mirrored::data::detail
