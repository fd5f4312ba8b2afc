// Split rules of experimental_distribute_dataset: how a global batch becomes one slice per
// replica (see RebatchPolicy and docs/data.md).
#include <algorithm>

#include "mirrored/data/detail/rebatch.hpp"
#include "mirrored/detail/balanced_split.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::data::detail {
namespace {

// Sizes of all N slices of a batch of g rows, in global replica order (the BALANCED rule).
std::vector<int64_t> balanced_sizes(int64_t g, int n) {
  std::vector<int64_t> sizes;
  sizes.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) sizes.push_back(mirrored::detail::balanced_piece(g, n, r).count);
  return sizes;
}

}  // namespace

std::vector<int64_t> batch_sizes_for_worker(int64_t global_batch_size, int num_workers, int num_replicas_per_worker,
                                            int worker_index) {
  MIRRORED_ENFORCE(global_batch_size >= 0, InvalidArgumentError,
                   "batch_sizes_for_worker: global_batch_size must be >= 0 (got ", global_batch_size, ")");
  MIRRORED_ENFORCE(num_workers >= 1 && num_replicas_per_worker >= 1, InvalidArgumentError,
                   "batch_sizes_for_worker: num_workers and num_replicas_per_worker must be >= 1 (got ", num_workers,
                   " and ", num_replicas_per_worker, ")");
  MIRRORED_ENFORCE(0 <= worker_index && worker_index < num_workers, InvalidArgumentError,
                   "batch_sizes_for_worker: worker_index ", worker_index, " out of range for ", num_workers,
                   " workers");
  const std::vector<int64_t> all = balanced_sizes(global_batch_size, num_workers * num_replicas_per_worker);
  const auto first = all.begin() + static_cast<std::ptrdiff_t>(worker_index) * num_replicas_per_worker;
  return std::vector<int64_t>(first, first + num_replicas_per_worker);
}

std::vector<RowRange> split_rows(RebatchPolicy policy, int64_t rows, int num_slices) {
  MIRRORED_ENFORCE(num_slices >= 1 && rows >= 0, InternalError, "split_rows: ", rows, " rows into ", num_slices,
                   " slices");
  std::vector<RowRange> out;
  out.reserve(static_cast<std::size_t>(num_slices));
  if (policy == RebatchPolicy::CEIL) {
    const int64_t c = (rows + num_slices - 1) / num_slices;
    for (int r = 0; r < num_slices; ++r) out.emplace_back(std::min(r * c, rows), std::min((r + 1) * c, rows));
    return out;
  }
  // Every batch, full or partial, as evenly as possible: a replica is empty only when the batch
  // has fewer rows than there are replicas.
  int64_t begin = 0;
  for (int64_t size : balanced_sizes(rows, num_slices)) {
    out.emplace_back(begin, begin + size);
    begin += size;
  }
  return out;
}

}  // namespace mirrored::data::detail
