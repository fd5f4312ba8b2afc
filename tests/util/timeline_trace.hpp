#pragma once
// The timeline tests' reader: a trace file parsed with the project's strict JSON parser into its
// events, checked for the format on the way (Chrome's JSON object format, complete and metadata
// events only, events nested per thread), and a fixture with a temporary directory.
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fs_test_util.hpp"
#include "mirrored/timeline.hpp"
#include "util/json.hpp"

namespace mirrored::timeline_test {

namespace fs = std::filesystem;
namespace json = detail::json;

// One event of a parsed trace; times in integer nanoseconds (the file has microseconds with three
// decimals, exactly).
struct Event {
  std::string name, category, ph;
  int64_t pid = 0, tid = 0, ts_ns = 0, dur_ns = 0;
  const json::Value* args = nullptr;

  int64_t arg(const std::string& key) const {
    const json::Value* v = args ? args->find(key) : nullptr;
    if (!v || !v->as_int64()) ADD_FAILURE() << name << " has no integer argument " << key;
    return v && v->as_int64() ? *v->as_int64() : -1;
  }
  std::string str(const std::string& key) const {
    const json::Value* v = args ? args->find(key) : nullptr;
    if (!v || !v->is_string()) ADD_FAILURE() << name << " has no string argument " << key;
    return v && v->is_string() ? v->as_string() : "";
  }
  bool has(const std::string& key) const { return args && args->find(key); }
};

inline int64_t to_ns(const json::Value& v) {
  EXPECT_TRUE(v.is_number());
  return static_cast<int64_t>(std::llround(v.as_double() * 1000.0));
}

using testing::read_file;  // fs_test_util.hpp's

// A parsed trace: the document (events point into it) and its events, checked for the format.
struct Trace {
  json::Value doc;
  std::vector<Event> events;

  explicit Trace(const std::string& path) : doc(json::parse(read_file(path), path)) {
    EXPECT_TRUE(doc.is_object());
    const json::Value* unit = doc.find("displayTimeUnit");
    EXPECT_TRUE(unit && unit->is_string() && unit->as_string() == "ms");
    const json::Value* list = doc.find("traceEvents");
    EXPECT_TRUE(list && list->is_array());
    if (!list) return;
    for (const json::Value& v : list->items()) {
      Event e;
      EXPECT_TRUE(v.is_object());
      e.name = v.find("name")->as_string();
      e.ph = v.find("ph")->as_string();
      e.pid = *v.find("pid")->as_int64();
      e.tid = *v.find("tid")->as_int64();
      e.args = v.find("args");
      if (e.ph == "X") {
        e.category = v.find("cat")->as_string();
        e.ts_ns = to_ns(*v.find("ts"));
        e.dur_ns = to_ns(*v.find("dur"));
        EXPECT_GE(e.ts_ns, 0);
        EXPECT_GE(e.dur_ns, 0);
      } else {
        EXPECT_EQ(e.ph, "M") << "only complete and metadata events are written";
      }
      events.push_back(std::move(e));
    }
    check_nesting();
  }

  // Per thread, any two events are disjoint or one contains the other (what B/E pairs of one thread
  // must be): in order of start (longest first on a tie), each event starts at or after its
  // enclosing one and ends no later.
  void check_nesting() const {
    std::map<int64_t, std::vector<const Event*>> by_tid;
    for (const Event& e : events)
      if (e.ph == "X") by_tid[e.tid].push_back(&e);
    for (auto& [tid, list] : by_tid) {
      std::sort(list.begin(), list.end(), [](const Event* a, const Event* b) {
        return a->ts_ns != b->ts_ns ? a->ts_ns < b->ts_ns : a->dur_ns > b->dur_ns;
      });
      std::vector<const Event*> open;
      int64_t last_ts = 0;
      for (const Event* e : list) {
        EXPECT_GE(e->ts_ns, last_ts);
        last_ts = e->ts_ns;
        while (!open.empty() && open.back()->ts_ns + open.back()->dur_ns <= e->ts_ns) open.pop_back();
        if (!open.empty()) {
          EXPECT_LE(e->ts_ns + e->dur_ns, open.back()->ts_ns + open.back()->dur_ns)
              << e->name << " overlaps " << open.back()->name << " on thread " << tid << " without nesting";
        }
        open.push_back(e);
      }
    }
  }

  std::vector<const Event*> named(const std::string& name) const {
    std::vector<const Event*> out;
    for (const Event& e : events)
      if (e.ph == "X" && e.name == name) out.push_back(&e);
    return out;
  }
  // The thread_name metadata of `tid` ("" when none).
  std::string thread_name(int64_t tid) const {
    std::string name;
    for (const Event& e : events)
      if (e.ph == "M" && e.name == "thread_name" && e.tid == tid) name = e.str("name");
    return name;
  }
  // The innermost event of `tid` that contains `e` and is named `outer`, or null.
  const Event* enclosing(const Event& e, const std::string& outer) const {
    for (const Event& o : events) {
      if (o.ph == "X" && o.name == outer && o.tid == e.tid && &o != &e && o.ts_ns <= e.ts_ns &&
          e.ts_ns + e.dur_ns <= o.ts_ns + o.dur_ns)
        return &o;
    }
    return nullptr;
  }
};

class TimelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    timeline::stop();  // nothing left from another test
    std::string tmpl = (fs::temp_directory_path() / "mirrored_timeline_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    try {
      timeline::stop();
    } catch (...) {
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  std::string dir_;
};

inline std::vector<std::string> cpus(int n) {
  std::vector<std::string> d;
  for (int i = 0; i < n; ++i) d.push_back("CPU:" + std::to_string(i));
  return d;
}

}  // namespace mirrored::timeline_test
