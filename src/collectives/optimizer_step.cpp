// The optimizer step of the collective plan (OptimizerStep, <mirrored/detail/optimizer_step.hpp>):
// one call of apply_gradients with a fused update, for every kind of replica and worker.
//
//   agree        the replicas join as `apply_gradients` and check they update the same variables
//                with the same optimizer, before any byte moves
//   fused        one worker whose local ops have a path of their own
//                (CrossDeviceOps::all_reduce_and_update): CPU replicas sum each slice and update it
//                in one pass; NCCL GPUs with sharded state run the reduce-scatter, the update of
//                the slice and the all-gather in one stream's order (nccl_optimizer_step.cpp)
//   otherwise    unsharded: an all-reduce of the packed gradients, then every copy updated on its
//                device; sharded: per pack, a reduce-scatter of the gradients cut by variable
//                slices (optimizer_layout.hpp), this replica's slices updated (with its slices of
//                the slots), and an all-gather of the updated slices into every copy
//
// Either way the sums are in replica order and the update is the backend's fused loop, so on CPU
// replicas every path gives the same bits.
#include <algorithm>
#include <exception>
#include <utility>

#include "collectives/collective_plan.hpp"
#include "collectives/flight_recorder.hpp"
#include "collectives/optimizer_layout.hpp"
#include "collectives/packing.hpp"
#include "mirrored/detail/format.hpp"
#include "mirrored/detail/optimizer_step.hpp"
#include "util/exceptions.hpp"
#include "util/log.hpp"
#include "util/timeline.hpp"

namespace mirrored::detail {
namespace {

const OptimizerStep& update_of(const CollectiveGroup& group, int r) {
  return *static_cast<const CollectiveRequest*>(group.payload(r))->update;
}

std::string describe_update(const OptimizerUpdate& u) {
  return str_cat("kind ", static_cast<int>(u.kind), ", learning_rate ", u.learning_rate, ", momentum ", u.momentum,
                 ", beta_1 ", u.beta_1, ", beta_2 ", u.beta_2, ", epsilon ", u.epsilon, ", weight_decay ",
                 u.weight_decay, ", rho ", u.rho, ", initial_accumulator_value ", u.initial_accumulator_value);
}

bool same_update(const OptimizerUpdate& a, const OptimizerUpdate& b) { return a == b; }

// Every replica checks every replica's step against replica 0's, in the same order, so all reach
// the same verdict.
void agree_optimizer_step(const CollectiveGroup& group) {
  const OptimizerStep& first = update_of(group, 0);
  for (int r = 1; r < group.size(); ++r) {
    const OptimizerStep& other = update_of(group, r);
    MIRRORED_ENFORCE(other.params.size() == first.params.size(), InvalidArgumentError,
                     "apply_gradients: replica 0 passed ", first.params.size(), " gradients but replica ", r,
                     " passed ", other.params.size());
    MIRRORED_ENFORCE(other.dtype == first.dtype, InvalidArgumentError, "apply_gradients: replica 0 updates dtype ",
                     dtype_name(first.dtype), " but replica ", r, " updates ", dtype_name(other.dtype));
    for (std::size_t v = 0; v < first.variables.size() && v < other.variables.size(); ++v) {
      MIRRORED_ENFORCE(other.variables[v] == first.variables[v], InvalidArgumentError,
                       "apply_gradients: every replica must pass the same variables in the same order: replica 0 "
                       "passed '",
                       *first.names[v], "' at position ", v, " but replica ", r, " passed '", *other.names[v], "'");
    }
    for (std::size_t v = 0; v < first.params.size(); ++v) {
      MIRRORED_ENFORCE(other.params[v].shape == first.params[v].shape, InvalidArgumentError,
                       "apply_gradients: replica 0 passed gradient ", v, " of shape ",
                       format_shape(first.params[v].shape), " but replica ", r, " passed shape ",
                       format_shape(other.params[v].shape));
    }
    MIRRORED_ENFORCE(same_update(other.update, first.update), InvalidArgumentError,
                     "apply_gradients: replica 0's optimizer has ", describe_update(first.update), " but replica ", r,
                     "'s has ", describe_update(other.update));
    MIRRORED_ENFORCE(other.sharded == first.sharded && other.aggregate == first.aggregate && other.pack == first.pack,
                     InvalidArgumentError, "apply_gradients: replica 0 passed shard_optimizer_state ", first.sharded,
                     ", skip_gradients_aggregation ", !first.aggregate, ", pack_gradients ", first.pack,
                     " but replica ", r, " passed ", other.sharded, ", ", !other.aggregate, ", ", other.pack);
    MIRRORED_ENFORCE(other.communication.bytes_per_pack == first.communication.bytes_per_pack &&
                         other.communication.compression == first.communication.compression,
                     InvalidArgumentError, "apply_gradients: replica 0 passed bytes_per_pack ",
                     first.communication.bytes_per_pack, " and compression ",
                     compression_name(first.communication.compression), " but replica ", r, " passed ",
                     other.communication.bytes_per_pack, " and ", compression_name(other.communication.compression));
  }
}

// The step counter where `device`'s kernels can read it: step_in itself, or a copy.
class StepCounters {
 public:
  explicit StepCounters(const OptimizerStep& s) : s_(s) {}
  const int64_t* on(const Device& device) {
    if (device == s_.step_in.device()) return static_cast<const int64_t*>(s_.step_in.data());
    for (const auto& c : copies_)
      if (c.device() == device) return static_cast<const int64_t*>(c.data());
    copies_.push_back(make_untyped(DType::int64, {}, device));
    copy_between(copies_.back().data(), device, s_.step_in.data(), s_.step_in.device(), sizeof(int64_t));
    return static_cast<const int64_t*>(copies_.back().data());
  }
  // The new count, once every pack was updated.
  void write() {
    backend_for(s_.step_in.device())
        .apply_optimizer(s_.dtype, s_.update, nullptr, 0, on(s_.step_in.device()),
                         static_cast<int64_t*>(s_.step_out.data()));
  }

 private:
  const OptimizerStep& s_;
  std::vector<UntypedTensor> copies_;
};

// The parameters and slots of the packs that run before the last launch of a step, as they were
// before it: copied on their device's stream ahead of the first update, and copied back (in stream
// order, after the packs that ran) when a later launch fails, so that a failed step changes
// nothing. A copy within the device costs no host wait and needs no change to the update kernel;
// a step of one launch per device (at most kMaxUpdateSegments variables) keeps nothing.
constexpr std::size_t kMaxBackupBytes = std::size_t{256} << 20;

class PackBackup {
 public:
  explicit PackBackup(DType dtype) : dtype_(dtype) {}

  void keep(const Device& device, const UpdateSegment& seg) {
    keep_buffer(device, seg.param, seg.count);
    for (void* p : seg.slot) keep_buffer(device, p, seg.count);
  }

  void keep_buffer(const Device& device, void* p, int64_t count) {
    if (!p || count == 0) return;
    Saved saved{device, p, make_untyped(dtype_, {count}, device)};
    backend_for(device).copy_within(saved.copy.data(), p, saved.copy.bytes());
    saved_.push_back(std::move(saved));
  }

  // Puts back the first `entries` copies kept (those of the packs that ran), in stream order after
  // them; the caller rethrows the failure.
  void restore(std::size_t entries) noexcept {
    try {
      for (std::size_t i = 0; i < entries && i < saved_.size(); ++i)
        backend_for(saved_[i].device).copy_within(saved_[i].where, saved_[i].copy.data(), saved_[i].copy.bytes());
    } catch (const std::exception& e) {
      // The device refuses even copies (a sticky error): its memory is lost with it, and the
      // failure being reported already says so.
      MIRRORED_LOG(warn, "apply_gradients: could not restore the parameters after a failed update: ", e.what());
    }
  }
  std::size_t entries() const noexcept { return saved_.size(); }

 private:
  struct Saved {
    Device device;
    void* where;
    UntypedTensor copy;
  };
  const DType dtype_;
  std::vector<Saved> saved_;
};

}  // namespace

void update_copies(const OptimizerStep& s, const std::vector<UntypedTensor>& grads) {
  StepCounters steps(s);
  const std::size_t elem = dtype_size(s.dtype);
  // Everything that can fail before an update runs is done for every pack first: the gradients
  // brought to their parameters' device, the step counters, the segments, the backup.
  struct Launch {
    Device device;
    std::vector<UpdateSegment> segments;
    const int64_t* step_in = nullptr;
    std::size_t kept = 0;  // backup entries of this pack and those before it
  };
  std::vector<Launch> launches;
  std::vector<UntypedTensor> moved;  // gradients brought to their parameters' device
  for (const Pack& pack : optimizer_packs(s)) {
    Launch launch{.device = s.params[pack.leaves.front()].device(), .segments = {}};
    for (std::size_t v : pack.leaves) {
      UpdateSegment seg;
      seg.param = s.params[v].data();
      seg.count = s.params[v].numel;
      for (std::size_t k = 0; k < s.slots[v].size(); ++k)
        seg.slot[k] = s.slots[v][k].storage ? s.slots[v][k].data() : nullptr;
      if (grads[v].device() == launch.device) {
        seg.grad = grads[v].data();
      } else {
        moved.push_back(make_untyped(s.dtype, grads[v].shape, launch.device));
        copy_between(moved.back().data(), launch.device, grads[v].data(), grads[v].device(), grads[v].numel * elem);
        seg.grad = moved.back().data();
      }
      launch.segments.push_back(seg);
    }
    launch.step_in = steps.on(launch.device);
    launches.push_back(std::move(launch));
  }
  // The last pack writes the new count itself when it runs where the count lives: one launch less,
  // and a step of one pack is then one launch, which either runs whole or not at all.
  int64_t* const step_out = static_cast<int64_t*>(s.step_out.data());
  const bool last_writes_step = !launches.empty() && launches.back().device == s.step_in.device();
  // A launch that fails after others ran must find their parameters and slots as they were: every
  // pack that may be followed by a launch is backed up before the first update -- on devices whose
  // launches can fail (a host update does not, once prepared), and up to kMaxBackupBytes: a copy of
  // a large model's parameters and slots would take memory it may not have, and on CUDA a launch
  // that fails after others succeeded is in practice a sticky error, after which the device's
  // memory is lost anyway (docs/gpu.md).
  PackBackup backup(s.dtype);
  const std::size_t backed = last_writes_step ? launches.size() - 1 : launches.size();
  std::size_t backup_bytes = 0;
  bool launch_can_fail = false;
  for (std::size_t j = 0; j < backed; ++j) {
    launch_can_fail = launch_can_fail || !launches[j].device.is_host();
    for (const UpdateSegment& seg : launches[j].segments) {
      if (seg.param) backup_bytes += static_cast<std::size_t>(seg.count) * elem;
      for (const void* p : seg.slot)
        if (p) backup_bytes += static_cast<std::size_t>(seg.count) * elem;
    }
  }
  if (launches.size() + (last_writes_step ? 0 : 1) > 1 && launch_can_fail && backup_bytes <= kMaxBackupBytes) {
    for (std::size_t j = 0; j < backed; ++j) {
      for (const UpdateSegment& seg : launches[j].segments) backup.keep(launches[j].device, seg);
      launches[j].kept = backup.entries();
    }
  }
  std::size_t ran = 0;  // packs launched
  try {
    for (const Launch& launch : launches) {
      const bool writes_step = last_writes_step && &launch == &launches.back();
      backend_for(launch.device)
          .apply_optimizer(s.dtype, s.update, launch.segments.data(), static_cast<int>(launch.segments.size()),
                           launch.step_in, writes_step ? step_out : nullptr);
      ++ran;
    }
    if (!last_writes_step) steps.write();
  } catch (...) {
    // Packs 0 .. ran-1 ran (the last of them, when it wrote the step, cannot be among them).
    const std::size_t undo = std::min(ran, backed);
    backup.restore(undo == 0 ? 0 : launches[undo - 1].kept);
    throw;
  }
}

void CollectivePlan::apply_gradients(int replica, OptimizerStep& mine, const Deadline& deadline) {
  timeline::Scope trace("apply_gradients", "collective");
  const int n = group_.size();
  if (!mine.sharded && !mine.aggregate) {
    // Gradients reduced already and nothing to gather: every replica updates its own copies, as it
    // would without the library.
    update_copies(mine, mine.grads);
    return;
  }
  FlightCall flight(group_.recorder().ring(replica), deadline, CollectiveKind::apply_gradients, &mine.grads,
                    static_cast<int>(ReduceOp::SUM), false);
  // What every replica posts for the fused paths: its gradients, its copies and the step itself.
  const CollectiveRequest post{.kind = CollectiveKind::apply_gradients,
                               .inputs = &mine.grads,
                               .outputs = &mine.params,
                               .options = mine.communication,
                               .update = &mine};
  if (n > 1) {
    join_traced(group_, replica, CollectiveKind::apply_gradients, &post, deadline);
    bool fused = false;
    inside_collective(group_, replica, [&] {
      agree_optimizer_step(group_);
      CollectiveStep step(group_, replica, group_.deadline());
      if (stage_->num_workers() == 1 && mine.aggregate) fused = local_->all_reduce_and_update(step);
      // Nobody's post goes away while another replica still reads it, and every copy is final
      // before anyone returns.
      step.sync();
    });
    if (fused) {
      flight.done();
      return;
    }
  } else if (mine.sharded && mine.aggregate && stage_->num_workers() == 1 && !mine.params.empty() &&
             !mine.params.front().device().is_host()) {
    // One GPU replica: its ops may still have a fused path (NCCL's one-rank communicator under
    // MIRRORED_NCCL_SINGLE_RANK, which a machine with one GPU tests). Host replicas keep the
    // separate passes, as before.
    CollectiveStep solo(post, deadline);
    if (local_->all_reduce_and_update(solo)) {
      flight.done();
      return;
    }
  }
  if (!mine.sharded) {
    if (n * stage_->num_workers() == 1) {
      update_copies(mine, mine.grads);  // the sum of one replica's gradients
      flight.done();
      return;
    }
    std::vector<UntypedTensor> reduced;
    for (const auto& g : mine.grads) reduced.push_back(make_untyped(g.dtype, g.shape, g.device()));
    // The optimizer's options, but with pack_gradients false a pack size of one byte, which closes
    // every pack after its first tensor.
    CommunicationOptions options = mine.communication;
    if (!mine.pack) options.bytes_per_pack = 1;
    all_reduce(replica,
               {.kind = CollectiveKind::all_reduce,
                .op = ReduceOp::SUM,
                .inputs = &mine.grads,
                .outputs = &reduced,
                .options = options},
               deadline);
    update_copies(mine, reduced);
    flight.done();
    return;
  }
  apply_sharded(replica, mine, deadline);
  flight.done();
}

void CollectivePlan::apply_sharded(int replica, OptimizerStep& mine, const Deadline& deadline) {
  const int local = group_.size();
  const int64_t num = static_cast<int64_t>(local) * stage_->num_workers();
  const int64_t me = static_cast<int64_t>(stage_->worker_index()) * local + replica;
  StepCounters steps(mine);
  for (const Pack& pack : optimizer_packs(mine)) {
    const Device device = mine.params[pack.leaves.front()].device();
    const ShardedPack layout = sharded_pack(mine, pack, num);
    std::vector<const UntypedTensor*> grads, params;
    for (std::size_t v : pack.leaves) {
      grads.push_back(&mine.grads[v]);
      params.push_back(&mine.params[v]);
    }
    // This replica's slices of the summed gradients (or of its own, already reduced).
    UntypedTensor slice;
    if (mine.aggregate) {
      const std::vector<UntypedTensor> in{pack_shard_major(layout, grads, -1, mine.dtype, device)};
      const std::vector<UntypedTensor> out{
          make_untyped(mine.dtype, {layout.split()[static_cast<std::size_t>(me)]}, device)};
      reduce_scatter(replica,
                     {.kind = CollectiveKind::reduce_scatter,
                      .op = ReduceOp::SUM,
                      .inputs = &in,
                      .outputs = &out,
                      .options = mine.communication,
                      .split = &layout.split()},
                     deadline);
      slice = out[0];
    } else {
      slice = pack_shard_major(layout, grads, me, mine.dtype, device);
    }
    // Update this replica's slices of the parameters, with its slices of the slots.
    const std::vector<UpdateSegment> segments = shard_update_segments(layout, mine, pack.leaves, me, slice);
    backend_for(device).apply_optimizer(mine.dtype, mine.update, segments.data(), static_cast<int>(segments.size()),
                                        steps.on(device), nullptr);
    // Every replica's updated slices into every copy.
    const std::vector<UntypedTensor> updated{pack_shard_major(layout, params, me, mine.dtype, device)};
    const UntypedTensor gathered = all_gather(
        replica, {.kind = CollectiveKind::all_gather, .inputs = &updated, .axis = 0, .options = mine.communication},
        deadline)[0];
    unpack_shard_major(layout, gathered, me, params);
  }
  steps.write();
}

}  // namespace mirrored::detail
