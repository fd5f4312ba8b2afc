#include "mirrored/multi_worker_mirrored_strategy.hpp"

#include "cluster/coordinator/multi_worker_runtime.hpp"
#include "cluster/resolvers/tf_config.hpp"
#include "collectives/ops_selection.hpp"
#include "runtime/worker_gpus.hpp"
#include "util/log.hpp"
#include "util/timeline.hpp"

namespace mirrored {
namespace detail::cluster {

/// What the constructor works out before the Strategy base exists.
struct MultiWorkerSetup {
  std::shared_ptr<ClusterResolver> resolver;
  ClusterLayout layout;
  std::vector<Device> devices;
  std::vector<std::string> default_gpus;  // the machine's names of the GPUs taken by default
};

namespace {

MultiWorkerSetup make_setup(const CommunicationOptions& o, std::shared_ptr<ClusterResolver> resolver,
                            const std::vector<std::string>& local_devices) {
  MultiWorkerSetup s;
  s.resolver = resolver ? std::move(resolver) : std::make_shared<TFConfigClusterResolver>();
  s.layout =
      resolve_layout(s.resolver->cluster_spec(), s.resolver->task_type(), s.resolver->task_id(), s.resolver->source());
  // Before the Strategy base reads MIRRORED_TIMELINE: each worker writes a file of its own.
  mirrored::detail::timeline::set_worker(s.layout.rank, s.layout.num_workers);
  std::vector<Device> local;
  if (local_devices.empty()) {
    // This worker's share of its machine's GPUs: the other workers there take the rest.
    DefaultDevices mine = default_worker_devices(
        s.resolver->local_placement(),
        s.layout.names.empty() ? std::string("this worker") : s.layout.names[static_cast<std::size_t>(s.layout.rank)]);
    local = std::move(mine.devices);
    s.default_gpus = std::move(mine.gpu_names);
  } else {
    for (std::size_t i = 0; i < local_devices.size(); ++i) {
      const Device d = Device::parse(local_devices[i]);
      for (std::size_t j = 0; j < local.size(); ++j) {
        MIRRORED_ENFORCE(!(local[j].type() == d.type() && local[j].index() == d.index()), InvalidArgumentError,
                         "No duplicates allowed in `local_devices` argument: '", local_devices[j], "' and '",
                         local_devices[i], "' name the same device");
      }
      MIRRORED_ENFORCE(device_exists(d), NotFoundError, "MultiWorkerMirroredStrategy: device ", d.to_string(), " ('",
                       local_devices[i], "') not found: ", list_logical_devices(DeviceType::GPU).size(),
                       " GPUs are visible");
      local.push_back(d);
    }
  }
  if (o.implementation == CommunicationImplementation::NCCL) {
    for (const Device& d : local) {
      MIRRORED_ENFORCE(!d.is_host(), InvalidArgumentError,
                       "MultiWorkerMirroredStrategy: CommunicationImplementation::NCCL needs GPU replicas, but ",
                       d.short_name(), " is a host device (use AUTO or RING)");
    }
  }
  // With a cluster, this worker's devices carry its job and task, as TF names them.
  for (const Device& d : local) {
    if (s.layout.addresses.empty()) {
      s.devices.push_back(d);
    } else {
      s.devices.push_back(Device::parse(str_cat("/job:", s.layout.task_type, "/replica:0/task:", s.layout.task_id,
                                                "/device:", device_type_name(d.type()), ":", d.index())));
    }
  }
  return s;
}

}  // namespace
}  // namespace detail::cluster

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(CommunicationOptions o,
                                                         std::shared_ptr<ClusterResolver> cluster_resolver,
                                                         std::vector<std::string> local_devices)
    : MultiWorkerMirroredStrategy(detail::cluster::make_setup(o, std::move(cluster_resolver), local_devices), o) {}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(detail::cluster::MultiWorkerSetup&& setup,
                                                         const CommunicationOptions& o)
    : Strategy(setup.devices, nullptr), resolver_(std::move(setup.resolver)) {
  if (o.timeout_seconds) extended().set_collective_timeout_seconds(*o.timeout_seconds);
  start_replica_threads();
  const auto& layout = setup.layout;
  if (layout.num_workers > 1) {
    try {
      runtime_ = std::make_shared<detail::cluster::MultiWorkerRuntime>(layout, extended().collective_timeout_seconds(),
                                                                       extended().worker_devices(), o.implementation,
                                                                       setup.default_gpus);
    } catch (const InvalidArgumentError& e) {
      // Workers configured differently (a launcher's WORLD_SIZE that differs between them): the
      // message names the chief's cluster and this worker's; say which variables made this one's.
      if (resolver_->source() == "TF_CONFIG") throw;
      throw InvalidArgumentError(detail::str_cat(e.what(), "; this worker's cluster comes from ", resolver_->source()));
    }
    attach_workers(runtime_);
  }
  std::string devices;
  for (const auto& d : extended().worker_devices()) devices += (devices.empty() ? "'" : ", '") + d.to_string() + "'";
  MIRRORED_LOG(info, "Using MultiWorkerMirroredStrategy with local devices (", devices, ") and ", layout.num_workers,
               layout.num_workers == 1 ? " worker" : " workers", "; this is ", layout.task_type, " ", layout.task_id,
               " (rank ", layout.rank, ")");
}

MultiWorkerMirroredStrategy::~MultiWorkerMirroredStrategy() {
  if (runtime_) runtime_->shutdown();
}

}  // namespace mirrored
