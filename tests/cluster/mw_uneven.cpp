// The scenario "uneven" of mirrored_mw_worker: uneven input across workers ends together (TF's
// rule: a worker whose input has ended gets empty batches until every worker's has). For
// experimental_distribute_dataset with DATA and FILE sharding (a worker whose file is empty has
// no data at all) and distribute_datasets_from_function with unequal batch counts (the last
// worker with none), every worker runs the same number of steps — each a training-like step
// whose replicas all-reduce their batch's rows, so a worker still in its loop would be left
// waiting — then the totals of rows, elements and values, summed across the workers, equal the
// data's, and every empty batch has 0 rows and the other dimensions of the element spec.
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "mw_worker.hpp"

namespace mirrored::mw {
namespace uneven {

// What a worker saw in one pass, and (after the pass) the same summed over every worker.
struct Seen {
  int64_t steps = 0, rows = 0, elements = 0, values_sum = 0, rows_all_reduced = 0;
};

// Runs the pass and checks it: `steps` expected on every worker, empty batches shaped `empty`,
// and the sums across workers equal to `want` (rows, elements, sum of values of the whole data).
template <class DD>
void check_pass(MultiWorkerMirroredStrategy& s, const std::string& name, const DD& dist, int64_t steps,
                const Shape& empty, const Seen& want) {
  Seen mine;
  for (const PerReplica<Tensor<int64_t>>& step : dist) {
    ++mine.steps;
    for (const auto& t : step.values()) {
      if (t.shape().at(0) == 0)
        CHECK(t.shape() == empty, name, ": an empty batch of shape ", detail::format_shape(t.shape()));
      mine.rows += t.shape()[0];
      mine.elements += t.numel();
      for (int64_t v : t.to_vector()) mine.values_sum += v;
    }
    // A training step: an empty batch contributes 0 rows to the all-reduce.
    const auto rows = s.run(
        [](const Tensor<int64_t>& t) {
          return get_replica_context()->all_reduce(ReduceOp::SUM, static_cast<float>(t.shape()[0]));
        },
        step);
    mine.rows_all_reduced += static_cast<int64_t>(rows[0]);
  }
  // Every worker's totals, on every worker: replica 0 carries this worker's numbers.
  const auto total = [&](int64_t v) {
    std::vector<int64_t> parts(s.extended().worker_devices().size(), 0);
    parts[0] = v;
    return s.reduce(ReduceOp::SUM, PerReplica<int64_t>(parts), std::nullopt);
  };
  // Every worker makes the same collectives whatever its checks find.
  const int64_t workers = s.extended().num_workers();
  const int64_t all_steps = total(mine.steps), rows = total(mine.rows), elements = total(mine.elements),
                values_sum = total(mine.values_sum);
  CHECK(mine.steps == steps, name, ": ", mine.steps, " steps, expected ", steps);
  CHECK(all_steps == workers * steps, name, ": the workers ran different numbers of steps");
  CHECK(rows == want.rows, name, ": rows ", rows, ", expected ", want.rows);
  CHECK(elements == want.elements, name, ": elements ", elements, ", expected ", want.elements);
  CHECK(values_sum == want.values_sum, name, ": sum ", values_sum, ", expected ", want.values_sum);
  // Each step's all-reduce summed every worker's rows of that step: over the pass, all the rows.
  CHECK(mine.rows_all_reduced == want.rows, name, ": all-reduced rows ", mine.rows_all_reduced, ", expected ",
        want.rows);
  std::cout << name << ": " << mine.steps << " steps, " << mine.rows << " of " << want.rows << " rows here"
            << std::endl;
}

// The whole data of `ds` (every batch, unsharded), as `check_pass` wants it.
Seen whole(const data::Dataset<Tensor<int64_t>>& ds) {
  Seen all;
  for (const auto& t : ds) {
    all.rows += t.shape()[0];
    all.elements += t.numel();
    for (int64_t v : t.to_vector()) all.values_sum += v;
  }
  return all;
}

// Rows of 3 columns (row i holds 3i, 3i + 1, 3i + 2), batched by 2.
data::Dataset<Tensor<int64_t>> rows_of_three(int64_t first_row, int64_t rows) {
  std::vector<int64_t> v;
  for (int64_t i = first_row; i < first_row + rows; ++i)
    for (int64_t c = 0; c < 3; ++c) v.push_back(3 * i + c);
  return data::from_tensor_slices(Tensor<int64_t>::from_vector(v, {rows, 3})).batch(2);
}

void write_records(const std::string& path, int64_t first, int64_t count) {
  std::ofstream out(path, std::ios::binary);
  for (int64_t v = first; v < first + count; ++v) out.write(reinterpret_cast<const char*>(&v), sizeof v);
  CHECK(out.good(), "writing ", path);
}

Tensor<int64_t> record_value(const Tensor<uint8_t>& record) {
  int64_t v = 0;
  std::memcpy(&v, record.data(), sizeof v);
  return Tensor<int64_t>::scalar(v);
}

}  // namespace uneven

int uneven_scenario(const Args& a) {
  using namespace uneven;
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  const int64_t W = s.extended().num_workers(), w = s.extended().worker_index(), R = a.replicas;

  // distribute_datasets_from_function: worker k has (W - k) * R batches of 2 rows (W - k steps),
  // the last worker (W = 3) none at all: every worker runs W steps.
  auto rows_of = [&](int64_t k) { return k == 2 ? 0 : 2 * (W - k) * R; };
  auto first_row = [](int64_t k) { return 1000 * k; };
  Seen fn_all;
  for (int64_t k = 0; k < W; ++k) {
    const Seen part = whole(rows_of_three(first_row(k), rows_of(k)));
    fn_all.rows += part.rows;
    fn_all.elements += part.elements;
    fn_all.values_sum += part.values_sum;
  }
  auto fn_dist = s.distribute_datasets_from_function(
      [&](const InputContext& ctx) { return rows_of_three(first_row(ctx.input_pipeline_id), rows_of(w)); });
  check_pass(s, "distribute_datasets_from_function", fn_dist, W, Shape{0, 3}, fn_all);
  check_pass(s, "distribute_datasets_from_function, second epoch", fn_dist, W, Shape{0, 3}, fn_all);

  // DATA: 2 full global batches of 2 rows per replica in sync and one of a single row, which only
  // global replica 0 gets: 3 steps everywhere.
  const int64_t n = W * R;
  const auto data_ds = data::range(4 * n + 1).batch(2 * n);
  check_pass(s, "experimental_distribute_dataset (DATA)", s.experimental_distribute_dataset(data_ds), 3, Shape{0},
             whole(data_ds));

  // FILE: worker k reads file k alone: 9 records (batches of 4, 4 and 1), 2, and (W = 3) none.
  // Each of a worker's batches is cut into W * R slices, R per step: W steps per batch, so
  // worker 0 runs 3 * W steps and the others pad.
  char tmpl[] = "/tmp/mw_uneven_XXXXXX";
  const char* dir = mkdtemp(tmpl);
  CHECK(dir != nullptr, "mkdtemp");
  if (dir == nullptr) return 1;
  std::vector<std::string> files;
  const int64_t records[] = {9, 2, 0};
  for (int64_t k = 0; k < W; ++k) {
    files.push_back(std::string(dir) + "/part" + std::to_string(k) + ".bin");
    write_records(files.back(), 100 * k, records[k]);
  }
  data::Options o;
  o.experimental_distribute.auto_shard_policy = data::AutoShardPolicy::FILE;
  const auto file_ds = data::fixed_length_record_dataset(files, 8).map(record_value).batch(4).with_options(o);
  check_pass(s, "experimental_distribute_dataset (FILE)", s.experimental_distribute_dataset(file_ds), 3 * W, Shape{0},
             whole(file_ds));
  std::filesystem::remove_all(dir);

  std::cout << (g_failures == 0 ? "OK worker " : "FAILED worker ") << w << std::endl;
  return g_failures ? 1 : 0;
}

// The victim's input pipeline throws at global batch `step`: the victim gets its error (with its
// type) from the iterator, and the other workers, waiting in the step's agreement or collectives,
// get AbortedError naming the victim and its error, long before their deadline (DeadlineExceeded).
int uneven_failure_scenario(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  const int rank = s.extended().worker_index();
  const int64_t n = s.num_replicas_in_sync(), victim = a.victim, at = a.step;
  const auto ds = data::range(100 * n).batch(n).map([rank, victim, at, n](const Tensor<int64_t>& t) {
    if (rank == victim && t.to_vector()[0] == at * n) throw std::runtime_error("boom in the input pipeline");
    return t;
  });
  int steps = 0;
  try {
    for (const auto& step : s.experimental_distribute_dataset(ds)) {
      s.run([](const Tensor<int64_t>&) { get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f); }, step);
      ++steps;
    }
    std::cout << "the pass ended without an error" << std::endl;
    return 3;
  } catch (const AbortedError& e) {
    std::cout << "AbortedError after " << steps << " steps: " << e.what() << std::endl;
    CHECK(rank != victim, "the victim got AbortedError");
    CHECK(std::string(e.what()).find(detail::str_cat("worker ", victim, " (")) != std::string::npos, "");
    CHECK(std::string(e.what()).find("boom in the input pipeline") != std::string::npos, "");
  } catch (const std::runtime_error& e) {  // the map function's, with its type (AbortedError is one too)
    std::cout << "worker " << rank << " threw after " << steps << " steps: " << e.what() << std::endl;
    CHECK(rank == victim, "a worker other than the victim got the pipeline's error");
    CHECK(steps == a.step, steps);
  }
  if (g_failures == 0) std::cout << "OK worker " << rank << std::endl;
  return g_failures ? 1 : 0;
}

// Worker 0 takes a step of a distributed dataset while the others all-reduce: every worker gets
// the same FailedPreconditionError naming both calls (no hang), and the strategy stays usable.
int uneven_mismatch_scenario(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  const int rank = s.extended().worker_index();
  const auto dist = s.experimental_distribute_dataset(data::range(8).batch(4));
  try {
    if (rank == 0) {
      auto it = dist.begin();
      it.get_next();
    } else {
      s.run([] { get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f); });
    }
    std::cout << "no error for different calls" << std::endl;
    return 3;
  } catch (const FailedPreconditionError& e) {
    std::cout << "FailedPreconditionError: " << e.what() << std::endl;
    const std::string m = e.what();
    CHECK(m.find("DistributedIterator get_next: another step") != std::string::npos, "");
    CHECK(m.find("all_reduce") != std::string::npos, "");
    CHECK(m.find("different number of collective calls") != std::string::npos, "");
  }
  const float sum = s.reduce(ReduceOp::SUM, s.run([] { return 1.0f; }), std::nullopt);
  CHECK(sum == static_cast<float>(s.num_replicas_in_sync()), sum);
  if (g_failures == 0) std::cout << "OK worker " << rank << std::endl;
  return g_failures ? 1 : 0;
}

// Steps of a distributed dataset and nothing else, until an error (a fault injected from outside,
// tests/bed/bed_fault.sh --program agreement): each get_next is the workers' agreement on whether
// any of them still has input, so a fault lands inside it.
int agreement_loop_scenario(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  const int64_t n = s.num_replicas_in_sync();
  const auto dist = s.experimental_distribute_dataset(data::range(2 * n).batch(2 * n).repeat());
  auto it = dist.begin();
  for (int64_t step = 0;; ++step) it.get_next();
}

}  // namespace mirrored::mw
