#pragma once
// Test helper: environment variables set (or unset) for one test, restored afterwards (the tests
// of an executable run one at a time).

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mirrored::testing {

/// Sets `name` to `value` (nullptr: unsets it) until destroyed.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

/// Unsets every variable of `cleared`, then sets `vars`, until destroyed.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const std::vector<std::string>& cleared, const std::map<std::string, std::string>& vars) {
    for (const auto& name : cleared)
      if (!vars.count(name)) envs_.emplace_back(std::make_unique<ScopedEnv>(name.c_str(), nullptr));
    for (const auto& [name, value] : vars) envs_.emplace_back(std::make_unique<ScopedEnv>(name.c_str(), value.c_str()));
  }

 private:
  std::vector<std::unique_ptr<ScopedEnv>> envs_;
};

}  // namespace mirrored::testing
