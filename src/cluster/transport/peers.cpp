// What a worker tells the others when it joins, as the job's store carries it.
#include "cluster/transport/peers.hpp"

#include <algorithm>
#include <exception>

#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {
namespace {

std::string sanitize(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '=' || c == '\r' || c == ',') c = '_';
  return s;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + sanitize(n);
  return out;
}

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> out;
  for (std::size_t start = 0; start < text.size();) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

std::string WorkerInfo::encode() const {
  return str_cat("host=", sanitize(hostname), "\nboot=", sanitize(boot_id), "\nipc=", sanitize(ipc_namespace),
                 "\npidns=", sanitize(pid_namespace), "\nreplicas=", local_replicas,
                 "\ndevices=", sanitize(device_kind), "\npid=", pid, "\nheartbeat=", sanitize(heartbeat_host), " ",
                 heartbeat_port, "\ngpus=", join_names(default_gpus), "\n");
}

WorkerInfo WorkerInfo::decode(const std::string& text) {
  WorkerInfo w;
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    try {
      if (key == "host") w.hostname = value;
      if (key == "boot") w.boot_id = value;
      if (key == "ipc") w.ipc_namespace = value;
      if (key == "pidns") w.pid_namespace = value;
      if (key == "replicas") w.local_replicas = std::stoi(value);
      if (key == "devices") w.device_kind = value;
      if (key == "pid") w.pid = std::stol(value);
      if (key == "gpus") w.default_gpus = split_names(value);
      if (key == "heartbeat") {
        const auto space = value.rfind(' ');
        if (space == std::string::npos) throw std::invalid_argument("no port");
        w.heartbeat_host = value.substr(0, space);
        w.heartbeat_port = std::stoi(value.substr(space + 1));
      }
    } catch (const std::exception&) {
      throw InvalidArgumentError(str_cat("MultiWorkerMirroredStrategy: a worker published a malformed '", key, "' (",
                                         value, ") in the job's store"));
    }
  }
  return w;
}

}  // namespace mirrored::detail::cluster
