// Shared memory within hosts, Gloo between them (two_level_transport.hpp).
#include "cluster/transport/two_level/two_level_transport.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "cluster/transport/gloo/gloo_transport.hpp"
#include "cluster/transport/shm/shm_transport.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {
namespace {

// The job's hosts: each a list of ranks (ascending), hosts ordered by their lowest rank, so that
// the chief (rank 0) leads host 0.
std::vector<std::vector<int>> hosts_of(const std::vector<WorkerInfo>& workers) {
  std::vector<std::vector<int>> hosts;
  std::map<std::string, std::size_t> index;
  for (int w = 0; w < static_cast<int>(workers.size()); ++w) {
    const auto& info = workers[static_cast<std::size_t>(w)];
    // A worker that published no kernel instance shares memory with nobody.
    const std::string domain = info.shared_memory_domain();
    const std::string key = domain.empty() ? "worker " + std::to_string(w) : domain;
    auto [it, fresh] = index.emplace(key, hosts.size());
    if (fresh) hosts.emplace_back();
    hosts[it->second].push_back(w);
  }
  return hosts;
}

class TwoLevelTransport final : public WorkerTransport {
 public:
  TwoLevelTransport(std::vector<std::vector<int>> hosts, int rank, std::unique_ptr<WorkerTransport> local,
                    std::unique_ptr<WorkerTransport> leaders)
      : hosts_(std::move(hosts)), rank_(rank), local_(std::move(local)), leaders_(std::move(leaders)) {
    for (std::size_t h = 0; h < hosts_.size(); ++h) {
      for (int w : hosts_[h])
        if (w == rank_) my_host_ = h;
      workers_ += static_cast<int>(hosts_[h].size());
    }
  }

  std::string name() const override {
    return str_cat("shared memory within hosts, Gloo over TCP between ", hosts_.size(), " hosts");
  }

  void all_reduce_sum(DType dtype, const void* in, void* out, int64_t count, Clock::time_point deadline) override {
    if (count == 0) return;
    if (dtype == DType::float16 || dtype == DType::bfloat16) {
      // Halves are summed in float in worker order and rounded once, as every transport does:
      // a per-host partial sum would round twice.
      return all_reduce_half(dtype, dtype, in, out, count, deadline);
    }
    const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
    if (local_)
      local_->all_reduce_sum(dtype, in, out, count, deadline);
    else if (in != out)
      std::memcpy(out, in, bytes);
    if (leaders_) leaders_->all_reduce_sum(dtype, out, out, count, deadline);
    if (local_) local_->broadcast(out, bytes, deadline);
  }

  void all_reduce_half(DType dtype, DType half, const void* in, void* out, int64_t count,
                       Clock::time_point deadline) override {
    if (count == 0) return;
    auto& host = backend_for(cpu0);
    const std::size_t wire = static_cast<std::size_t>(count) * dtype_size(half);
    std::vector<unsigned char> mine(wire), all(wire * static_cast<std::size_t>(workers_));
    host.cast(dtype, in, half, mine.data(), count);
    all_gather(mine.data(), all.data(), std::vector<std::size_t>(static_cast<std::size_t>(workers_), wire), deadline);
    std::vector<const void*> parts(static_cast<std::size_t>(workers_));
    for (int w = 0; w < workers_; ++w)
      parts[static_cast<std::size_t>(w)] = all.data() + wire * static_cast<std::size_t>(w);
    host.sum_n(half, parts.data(), workers_, mine.data(), count);
    host.cast(half, mine.data(), dtype, out, count);
  }

  void all_gather(const void* in, void* out, const std::vector<std::size_t>& sizes,
                  Clock::time_point deadline) override {
    // Within the host (members in rank order), between the leaders (hosts in order), back to
    // every member; then from host order into rank order.
    std::vector<std::size_t> offsets(sizes.size(), 0);
    for (std::size_t w = 1; w < sizes.size(); ++w) offsets[w] = offsets[w - 1] + sizes[w - 1];
    const std::size_t total = offsets.back() + sizes.back();
    std::vector<std::size_t> host_bytes(hosts_.size(), 0);
    for (std::size_t h = 0; h < hosts_.size(); ++h)
      for (int w : hosts_[h]) host_bytes[h] += sizes[static_cast<std::size_t>(w)];
    std::vector<unsigned char> blob(host_bytes[my_host_]);
    if (local_) {
      std::vector<std::size_t> member_sizes;
      for (int w : hosts_[my_host_]) member_sizes.push_back(sizes[static_cast<std::size_t>(w)]);
      local_->all_gather(in, blob.data(), member_sizes, deadline);
    } else if (!blob.empty()) {
      std::memcpy(blob.data(), in, blob.size());
    }
    std::vector<unsigned char> gathered(total);
    if (leaders_) leaders_->all_gather(blob.data(), gathered.data(), host_bytes, deadline);
    if (local_ && total > 0) local_->broadcast(gathered.data(), total, deadline);
    std::size_t at = 0;
    for (const auto& members : hosts_) {
      for (int w : members) {
        const auto k = static_cast<std::size_t>(w);
        if (sizes[k] > 0) std::memcpy(static_cast<unsigned char*>(out) + offsets[k], gathered.data() + at, sizes[k]);
        at += sizes[k];
      }
    }
  }

  void broadcast(void* buf, std::size_t bytes, Clock::time_point deadline) override {
    // The chief leads host 0, which is the leaders' rank 0.
    if (leaders_) leaders_->broadcast(buf, bytes, deadline);
    if (local_) local_->broadcast(buf, bytes, deadline);
  }

  void interrupt() noexcept override {
    if (local_) local_->interrupt();
    if (leaders_) leaders_->interrupt();
  }

 private:
  std::vector<std::vector<int>> hosts_;
  int rank_;
  std::size_t my_host_ = 0;
  int workers_ = 0;
  std::unique_ptr<WorkerTransport> local_;    // this host's workers (none when it has one)
  std::unique_ptr<WorkerTransport> leaders_;  // the hosts' leaders (this worker leads its host)
};

}  // namespace

std::unique_ptr<WorkerTransport> make_two_level_transport_if_grouped(const TransportJob& job, const std::string& host,
                                                                     std::chrono::steady_clock::time_point deadline) {
  if (shared_memory_disabled()) return nullptr;
  auto hosts = hosts_of(job.workers);
  const bool grouped = std::any_of(hosts.begin(), hosts.end(), [](const auto& h) { return h.size() > 1; });
  if (hosts.size() < 2 || !grouped) return nullptr;

  std::size_t my_host = 0;
  int local_rank = 0;
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    for (std::size_t i = 0; i < hosts[h].size(); ++i) {
      if (hosts[h][i] == job.rank) {
        my_host = h;
        local_rank = static_cast<int>(i);
      }
    }
  }
  const auto& members = hosts[my_host];
  std::unique_ptr<WorkerTransport> local;
  if (members.size() > 1) {
    std::vector<WorkerInfo> infos;
    std::vector<std::string> names;
    for (int w : members) {
      infos.push_back(job.workers[static_cast<std::size_t>(w)]);
      names.push_back(job.names[static_cast<std::size_t>(w)]);
    }
    const std::string prefix = str_cat(job.prefix, "host", my_host, "/");
    const TransportJob sub{.store = job.store, .prefix = prefix, .rank = local_rank, .workers = infos, .names = names};
    local = make_shm_transport_if_same_host(sub, deadline);
    if (!local) {
      throw UnavailableError(str_cat("MultiWorkerMirroredStrategy: the workers on the host of ",
                                     job.names[static_cast<std::size_t>(members[0])],
                                     " cannot share memory (see the log); set MIRRORED_SHARED_MEMORY=0 to put every "
                                     "worker on TCP"));
    }
  }
  std::unique_ptr<WorkerTransport> leaders;
  if (local_rank == 0) {
    leaders = make_gloo_transport(job.store, job.prefix + "leaders/", host, static_cast<int>(my_host),
                                  static_cast<int>(hosts.size()), deadline);
  }
  return std::make_unique<TwoLevelTransport>(std::move(hosts), job.rank, std::move(local), std::move(leaders));
}

}  // namespace mirrored::detail::cluster
