#include "mirrored/device.hpp"

#include <charconv>
#include <optional>

#include "device/gpu/logical_gpus.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {
namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos - start));
    if (pos == std::string_view::npos) return out;
    start = pos + 1;
  }
}

[[noreturn]] void bad_spec(std::string_view spec, const std::string& why) {
  throw InvalidArgumentError("Invalid device specification '" + std::string(spec) + "': " + why);
}

int parse_index(std::string_view spec, std::string_view what, std::string_view text) {
  int value = -1;
  const auto res = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || res.ec != std::errc() || res.ptr != text.data() + text.size() || value < 0)
    bad_spec(spec, std::string(what) + " '" + std::string(text) + "' is not a non-negative integer");
  return value;
}

}  // namespace

const char* device_type_name(DeviceType type) noexcept { return type == DeviceType::CPU ? "CPU" : "GPU"; }

Device Device::parse(std::string_view spec) {
  std::string_view body = spec;
  if (!body.empty() && body.front() == '/') body.remove_prefix(1);
  if (body.empty()) bad_spec(spec, "empty");
  Device d;
  bool have_job = false, have_replica = false, have_task = false, have_type = false;
  auto set_type = [&](DeviceType type, std::string_view index) {
    if (have_type) bad_spec(spec, "more than one device type");
    have_type = true;
    d.type_ = type;
    d.index_ = parse_index(spec, "device index", index);
  };
  for (std::string_view part : split(body, '/')) {
    const auto tokens = split(part, ':');
    const std::string_view key = tokens[0];
    if (key == "job" || key == "replica" || key == "task") {
      if (tokens.size() != 2 || tokens[1].empty())
        bad_spec(spec, detail::str_cat("'", part, "' is not '", key, ":<value>'"));
      bool& seen = key == "job" ? have_job : key == "replica" ? have_replica : have_task;
      if (seen) bad_spec(spec, "'" + std::string(key) + "' given twice");
      seen = true;
      if (key == "job")
        d.job_ = std::string(tokens[1]);
      else if (key == "replica")
        d.replica_ = parse_index(spec, "replica", tokens[1]);
      else
        d.task_ = parse_index(spec, "task", tokens[1]);
    } else if (key == "device") {
      if (tokens.size() != 3) bad_spec(spec, "'" + std::string(part) + "' is not 'device:<CPU|GPU>:<index>'");
      if (tokens[1] == "CPU")
        set_type(DeviceType::CPU, tokens[2]);
      else if (tokens[1] == "GPU")
        set_type(DeviceType::GPU, tokens[2]);
      else
        bad_spec(spec, "unknown device type '" + std::string(tokens[1]) +
                           "' after 'device:' (expected CPU or GPU, in upper case)");
    } else if (key == "CPU" || key == "cpu" || key == "GPU" || key == "gpu") {
      if (tokens.size() != 2) bad_spec(spec, "'" + std::string(part) + "' is not '" + std::string(key) + ":<index>'");
      set_type(key == "CPU" || key == "cpu" ? DeviceType::CPU : DeviceType::GPU, tokens[1]);
    } else {
      bad_spec(spec, "unknown attribute '" + std::string(part) + "'");
    }
  }
  if (!have_type) bad_spec(spec, "no device type (expected e.g. 'CPU:0' or '/device:GPU:0')");
  return d;
}

std::string Device::to_string() const {
  return "/job:" + job_ + "/replica:" + std::to_string(replica_) + "/task:" + std::to_string(task_) +
         "/device:" + device_type_name(type_) + ":" + std::to_string(index_);
}

std::string Device::short_name() const { return std::string(device_type_name(type_)) + ":" + std::to_string(index_); }

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.to_string(); }

std::vector<Device> list_logical_devices(DeviceType type) {
  if (type == DeviceType::CPU) return {Device(DeviceType::CPU, 0)};
  std::vector<Device> out;
  const int n = detail::logical_gpu_count();
  for (int i = 0; i < n; ++i) out.emplace_back(DeviceType::GPU, i);
  return out;
}

bool device_exists(const Device& d) {
  if (d.type() == DeviceType::CPU) return true;
  return d.index() < detail::logical_gpu_count();
}

}  // namespace mirrored
