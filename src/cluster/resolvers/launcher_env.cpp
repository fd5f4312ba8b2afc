// Environment variables of the launchers (launcher_env.hpp).
#include "cluster/resolvers/launcher_env.hpp"

#include <cstdlib>

#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {

std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

namespace {

std::optional<int> parse_number(const std::string& text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  for (char c : text)
    if (c < '0' || c > '9') return std::nullopt;
  return std::stoi(text);
}

}  // namespace

EnvNumber env_number(const char* resolver, std::initializer_list<const char*> names) {
  EnvNumber out;
  std::size_t k = 0;
  for (const char* name : names) out.names += str_cat(k++ == 0 ? "" : k == names.size() ? " or " : ", ", name);
  std::string first;
  for (const char* name : names) {
    const auto text = env_value(name);
    if (!text) continue;
    const auto n = parse_number(*text);
    MIRRORED_ENFORCE(n, InvalidArgumentError, resolver, ": ", name, "='", *text,
                     "' is not a non-negative whole number");
    const std::string shown = str_cat(name, "=", *text);
    MIRRORED_ENFORCE(!out.value || *out.value == *n, InvalidArgumentError, resolver, ": ", first, " and ", shown,
                     " disagree: the launcher's variables must name the same number");
    if (!out.value) first = shown;
    out.value = n;
    out.shown.push_back(shown);
  }
  return out;
}

std::string join_shown(const std::vector<std::string>& shown) {
  std::string out;
  for (const auto& s : shown) out += (out.empty() ? "" : ", ") + s;
  return out;
}

Ranks check_ranks(const char* resolver, const EnvNumber& rank, const EnvNumber& size, const EnvNumber& local_rank,
                  const EnvNumber& local_size) {
  std::vector<std::string> all = rank.shown;
  for (const EnvNumber* n : {&size, &local_rank, &local_size}) all.insert(all.end(), n->shown.begin(), n->shown.end());
  const std::string values = all.empty() ? "" : str_cat(" (", join_shown(all), ")");
  MIRRORED_ENFORCE(rank.value && size.value, InvalidArgumentError, resolver, ": ",
                   !rank.value ? rank.names : size.names, " is not set", values,
                   ": a worker needs both its rank and the number of workers");
  Ranks r;
  r.rank = *rank.value;
  r.size = *size.value;
  MIRRORED_ENFORCE(r.size >= 1, InvalidArgumentError, resolver, ": the number of workers must be at least 1", values);
  MIRRORED_ENFORCE(r.rank < r.size, InvalidArgumentError, resolver, ": the rank must be below the number of workers",
                   values);
  if (local_size.value) {
    r.local_size = *local_size.value;
    MIRRORED_ENFORCE(r.local_size >= 1 && r.local_size <= r.size, InvalidArgumentError, resolver,
                     ": the number of workers on this machine must be from 1 to the number of workers", values);
  }
  if (local_rank.value) {
    r.local_rank = *local_rank.value;
    MIRRORED_ENFORCE(!local_size.value || r.local_rank < r.local_size, InvalidArgumentError, resolver,
                     ": the local rank must be below the number of workers on this machine", values);
    MIRRORED_ENFORCE(r.local_rank <= r.rank, InvalidArgumentError, resolver,
                     ": the local rank cannot exceed the rank (the workers of a machine are numbered in rank order)",
                     values);
  }
  return r;
}

Rendezvous rendezvous_from_env(const char* resolver, bool needed) {
  Rendezvous out;
  const char* host_var = env_value("MIRRORED_MASTER_ADDR") ? "MIRRORED_MASTER_ADDR" : "MASTER_ADDR";
  const char* port_var = env_value("MIRRORED_MASTER_PORT") ? "MIRRORED_MASTER_PORT" : "MASTER_PORT";
  const auto host = env_value(host_var);
  const auto port_text = env_value(port_var);
  if (host) out.shown.push_back(str_cat(host_var, "=", *host));
  if (port_text) out.shown.push_back(str_cat(port_var, "=", *port_text));
  std::optional<int> port;
  if (port_text) {
    port = parse_number(*port_text);
    MIRRORED_ENFORCE(port && *port >= 1 && *port <= 65535, InvalidArgumentError, resolver, ": ", port_var, "='",
                     *port_text, "' is not a port (a whole number from 1 to 65535)");
  }
  if (host && port) {
    const bool v6 = host->find(':') != std::string::npos && host->front() != '[';
    out.address = str_cat(v6 ? "[" : "", *host, v6 ? "]" : "", ":", *port);
  }
  if (!needed || !out.address.empty()) return out;
  const char* missing = !host && !port ? "MASTER_ADDR and MASTER_PORT are"
                        : !host        ? "MASTER_ADDR is"
                                       : "MASTER_PORT is";
  throw InvalidArgumentError(str_cat(
      resolver, ": ", missing,
      " not set (nor MIRRORED_MASTER_ADDR and MIRRORED_MASTER_PORT, which take their place): the workers meet at the "
      "chief's store on that address, which every worker must be given",
      out.shown.empty() ? "" : str_cat(" (set: ", join_shown(out.shown), ")")));
}

ClusterSpec rendezvous_cluster(const std::string& chief_address, int size) {
  ClusterSpec spec;
  if (size <= 1) return spec;
  auto& workers = spec.jobs["worker"];
  workers.assign(static_cast<std::size_t>(size), "");
  workers[0] = chief_address;
  return spec;
}

}  // namespace mirrored::detail::cluster

namespace mirrored::detail {

LauncherClusterResolver::LauncherClusterResolver(const char* resolver, const char* launcher,
                                                 std::initializer_list<const char*> rank,
                                                 std::initializer_list<const char*> size,
                                                 std::initializer_list<const char*> local_rank,
                                                 std::initializer_list<const char*> local_size, std::string rpc_layer)
    : SettledClusterResolver({}, "worker", 0, std::move(rpc_layer)) {
  using namespace cluster;
  const EnvNumber r = env_number(resolver, rank), n = env_number(resolver, size);
  const EnvNumber lr = env_number(resolver, local_rank), ln = env_number(resolver, local_size);
  const Ranks ranks = check_ranks(resolver, r, n, lr, ln);
  const Rendezvous at = rendezvous_from_env(resolver, ranks.size > 1);
  cluster_ = rendezvous_cluster(at.address, ranks.size);
  task_id_ = ranks.rank;
  local_rank_ = ranks.local_rank;
  local_size_ = ranks.local_size;
  // A local rank without the local size does not say how many workers share the machine: the
  // placement stays the default.
  if (lr.value && ln.value) {
    std::vector<std::string> local = lr.shown;
    local.insert(local.end(), ln.shown.begin(), ln.shown.end());
    local_ = {ranks.local_rank, ranks.local_size, 0, str_cat(launcher, " ", join_shown(local))};
  }
  std::vector<std::string> shown = r.shown;
  shown.insert(shown.end(), n.shown.begin(), n.shown.end());
  shown.insert(shown.end(), at.shown.begin(), at.shown.end());
  source_ = str_cat(launcher, " variables (", join_shown(shown), ")");
}

}  // namespace mirrored::detail
