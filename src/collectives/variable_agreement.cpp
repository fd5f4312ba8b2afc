// The replicas' agreement on the variables of an update (detail::agree_on_variables): before an
// optimizer makes slots or moves a byte, every replica must name the same variables in the same
// order, or the mirrored copies would silently go apart (each replica's copy of one variable
// updated with another's gradient).
#include <string>
#include <vector>

#include "collectives/collective_plan.hpp"
#include "util/exceptions.hpp"

namespace mirrored::detail {
namespace {

struct VariablesPost {
  const std::vector<const void*>* ids;
  const std::vector<std::string>* names;
  std::string* worker_error;  // replica 0's: what the agreement across workers found
};

std::string list_of(const std::vector<std::string>& names) {
  std::string out = "[";
  for (std::size_t i = 0; i < names.size(); ++i) out += str_cat(i ? ", '" : "'", names[i], "'");
  return out + "]";
}

// The same verdict on every replica: each compares every replica's list with replica 0's, in order.
void check_local(const std::vector<const VariablesPost*>& posts) {
  const VariablesPost& first = *posts[0];
  for (std::size_t r = 1; r < posts.size(); ++r) {
    const VariablesPost& other = *posts[r];
    if (*other.ids == *first.ids) continue;
    std::size_t at = 0;
    while (at < first.ids->size() && at < other.ids->size() && (*first.ids)[at] == (*other.ids)[at]) ++at;
    throw InvalidArgumentError(str_cat(
        "every replica must pass the same variables in the same order: replica 0 passed ", list_of(*first.names),
        " but replica ", r, " passed ", list_of(*other.names), " (they differ at position ", at,
        at < first.ids->size() && at < other.ids->size() && (*first.names)[at] == (*other.names)[at]
            ? ": two variables of the same name"
            : "",
        ")"));
  }
}

}  // namespace

void CollectivePlan::agree_on_variables(int replica, const char* op, const std::vector<const void*>& ids,
                                        const std::vector<std::string>& names, const Deadline& deadline) {
  auto across_workers = [&] {
    stage_->agree(
        op, [&] { return str_cat("variables ", list_of(names)); }, deadline);
  };
  try {
    if (group_.size() == 1) {
      across_workers();
      return;
    }
    std::string worker_error;
    const VariablesPost mine{&ids, &names, &worker_error};
    join_traced(group_, replica, CollectiveKind::agree_on_variables, &mine, deadline);
    inside_collective(group_, replica, [&] {
      std::vector<const VariablesPost*> posts;
      for (int r = 0; r < group_.size(); ++r) posts.push_back(static_cast<const VariablesPost*>(group_.payload(r)));
      check_local(posts);
      if (replica == 0) {
        try {
          across_workers();
        } catch (const InvalidArgumentError& e) {
          worker_error = e.what();
        }
      }
      group_.sync(replica, group_.deadline());
      const std::string error = *posts[0]->worker_error;
      group_.sync(replica, group_.deadline());  // replica 0's message lives until every replica has read it
      if (!error.empty()) throw InvalidArgumentError(error);
    });
  } catch (const InvalidArgumentError& e) {
    const std::string what = e.what();
    if (what.rfind(op, 0) == 0) throw;
    throw InvalidArgumentError(str_cat(op, ": ", what));
  }
}

}  // namespace mirrored::detail
