// The timeline's events (<mirrored/timeline.hpp>, src/util/timeline.hpp): every file is parsed back
// (timeline_trace.hpp) and checked event by event: exact counts and byte sizes of runs, collectives,
// cross-replica calls, prefetching and checkpoints, escaping, full buffers, exited threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "mirrored/checkpoint.hpp"
#include "mirrored/mirrored.hpp"
#include "mirrored/timeline.hpp"
#include "util/timeline.hpp"
#include "util/timeline_trace.hpp"

namespace mirrored::timeline_test {
namespace {

using ::testing::HasSubstr;

TEST_F(TimelineTest, RunsAndAllReducesAreCountedExactlyPerReplicaThread) {
  constexpr int kReplicas = 3, kRuns = 5, kReducesPerRun = 2;
  MirroredStrategy strategy(cpus(kReplicas));
  strategy.run([] {});  // a run before the timeline: not in it
  const std::string path = file("trace.json");
  timeline::start(path);
  EXPECT_TRUE(timeline::active());
  EXPECT_EQ(timeline::path(), path);
  for (int i = 0; i < kRuns; ++i) {
    auto out = strategy.run([] {
      auto* ctx = get_replica_context();
      Tensor<float> x = Tensor<float>::full({3, 4}, float(ctx->replica_id_in_sync_group() + 1));
      Tensor<float> sum;
      for (int k = 0; k < kReducesPerRun; ++k) sum = ctx->all_reduce(ReduceOp::SUM, x);
      return sum;
    });
    EXPECT_EQ(out.values()[0].to_vector()[0], 6.0f);  // 1 + 2 + 3
  }
  timeline::stop();
  EXPECT_FALSE(timeline::active());
  EXPECT_EQ(timeline::path(), "");

  const Trace trace(path);
  const auto runs = trace.named("run");
  ASSERT_EQ(runs.size(), std::size_t{kRuns * kReplicas});
  std::map<int64_t, std::set<int64_t>> steps_by_tid;
  std::map<int64_t, int64_t> replica_of_tid;
  for (const Event* e : runs) {
    EXPECT_EQ(e->category, "run");
    EXPECT_EQ(e->pid, 0);
    steps_by_tid[e->tid].insert(e->arg("step"));
    replica_of_tid[e->tid] = e->arg("replica");
  }
  ASSERT_EQ(steps_by_tid.size(), std::size_t{kReplicas}) << "one thread per replica";
  for (const auto& [tid, steps] : steps_by_tid) {
    // The strategy's runs 1..5 (run 0 came before the timeline).
    EXPECT_EQ(steps, (std::set<int64_t>{1, 2, 3, 4, 5}));
    const int64_t r = replica_of_tid[tid];
    EXPECT_EQ(trace.thread_name(tid), "replica " + std::to_string(r) + " (CPU:" + std::to_string(r) + ")");
  }
  const auto reduces = trace.named("all_reduce");
  ASSERT_EQ(reduces.size(), std::size_t{kRuns * kReplicas * kReducesPerRun});
  for (const Event* e : reduces) {
    EXPECT_EQ(e->category, "collective");
    EXPECT_EQ(e->arg("bytes"), 3 * 4 * 4);
    EXPECT_EQ(e->arg("tensors"), 1);
    EXPECT_EQ(e->str("op"), "SUM");
    EXPECT_EQ(e->str("dtype"), "float32");
    EXPECT_NE(trace.enclosing(*e, "run"), nullptr) << "a collective is inside its replica's run";
  }
  const auto waits = trace.named("rendezvous");
  ASSERT_EQ(waits.size(), reduces.size());
  for (const Event* e : waits) EXPECT_NE(trace.enclosing(*e, "all_reduce"), nullptr);
}

TEST_F(TimelineTest, NestedAllReduceAndAllGatherCarryTheirBytes) {
  MirroredStrategy strategy(cpus(2));
  const std::string path = file("nest.json");
  timeline::start(path);
  strategy.run([] {
    auto* ctx = get_replica_context();
    auto nest = std::make_tuple(Tensor<double>::full({5}, 1.0), Tensor<float>::full({2, 3}, 2.0f));
    (void)ctx->all_reduce(ReduceOp::MEAN, nest);
    (void)ctx->all_gather(Tensor<float>::full({2, 2}, 1.0f), 0);
  });
  timeline::stop();
  const Trace trace(path);
  const auto reduces = trace.named("all_reduce");
  ASSERT_EQ(reduces.size(), 2u);
  for (const Event* e : reduces) {
    EXPECT_EQ(e->arg("bytes"), 5 * 8 + 6 * 4);
    EXPECT_EQ(e->arg("tensors"), 2);
    EXPECT_EQ(e->str("op"), "MEAN");
    EXPECT_EQ(e->str("dtype"), "float64");
  }
  const auto gathers = trace.named("all_gather");
  ASSERT_EQ(gathers.size(), 2u);
  for (const Event* e : gathers) {
    EXPECT_EQ(e->arg("bytes"), 16);  // this replica's contribution
    EXPECT_EQ(e->arg("axis"), 0);
  }
  EXPECT_EQ(trace.named("rendezvous").size(), 4u);
}

// An asynchronous all-reduce is two spans: the collective itself on the replica's communication
// thread ("communication r", its rendezvous inside), and the replica's wait for it inside its run.
TEST_F(TimelineTest, AsynchronousAllReducesAreTracedOnTheCommunicationThreads) {
  constexpr int kReplicas = 2, kPerRun = 2;
  MirroredStrategy strategy(cpus(kReplicas));
  const std::string path = file("async.json");
  timeline::start(path);
  strategy.run([] {
    auto* ctx = get_replica_context();
    std::vector<PendingCollective<Tensor<float>>> pending;
    for (int k = 0; k < kPerRun; ++k)
      pending.push_back(ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>::full({6}, float(k + 1))));
    for (auto& p : pending) EXPECT_EQ(p.wait().to_vector()[0], 2.0f * float(&p - pending.data() + 1));
  });
  timeline::stop();
  const Trace trace(path);
  const auto transfers = trace.named("all_reduce_async");
  ASSERT_EQ(transfers.size(), std::size_t{kReplicas * kPerRun});
  std::set<std::string> threads;
  for (const Event* e : transfers) {
    EXPECT_EQ(e->category, "collective");
    EXPECT_EQ(e->arg("bytes"), 6 * 4);
    EXPECT_EQ(e->arg("tensors"), 1);
    EXPECT_EQ(e->str("op"), "SUM");
    EXPECT_EQ(trace.enclosing(*e, "run"), nullptr) << "not on a replica thread";
    threads.insert(trace.thread_name(e->tid));
  }
  EXPECT_EQ(threads, (std::set<std::string>{"communication 0", "communication 1"}));
  for (const Event* e : trace.named("rendezvous")) EXPECT_NE(trace.enclosing(*e, "all_reduce_async"), nullptr);
  EXPECT_EQ(trace.named("rendezvous").size(), transfers.size());
  const auto waits = trace.named("all_reduce_async.wait");
  ASSERT_EQ(waits.size(), std::size_t{kReplicas * kPerRun});
  for (const Event* e : waits) EXPECT_NE(trace.enclosing(*e, "run"), nullptr) << "the replica's own wait";
}

TEST_F(TimelineTest, ReduceGatherAndMergeCall) {
  MirroredStrategy strategy(cpus(2));
  const std::string path = file("cross.json");
  timeline::start(path);
  auto values =
      strategy.run([] { return Tensor<float>::full({4}, float(get_replica_context()->replica_id_in_sync_group())); });
  (void)strategy.reduce(ReduceOp::SUM, values, std::nullopt);
  (void)strategy.gather(values, 0);
  strategy.run([] { get_replica_context()->merge_call([](Strategy&, const PerReplica<int>&) {}, 1); });
  timeline::stop();

  const Trace trace(path);
  const auto reduce = trace.named("reduce");
  ASSERT_EQ(reduce.size(), 1u);
  EXPECT_EQ(reduce[0]->arg("bytes"), 16);
  EXPECT_EQ(reduce[0]->arg("tensors"), 1);
  EXPECT_EQ(reduce[0]->str("op"), "SUM");
  const auto gather = trace.named("gather");
  ASSERT_EQ(gather.size(), 1u);
  EXPECT_EQ(gather[0]->arg("bytes"), 32);
  // Both on the calling thread, which is no replica's.
  EXPECT_EQ(reduce[0]->tid, gather[0]->tid);
  for (const Event* run : trace.named("run")) EXPECT_NE(run->tid, reduce[0]->tid);

  const auto merges = trace.named("merge_call");
  ASSERT_EQ(merges.size(), 2u);
  const auto fns = trace.named("merge_fn");
  ASSERT_EQ(fns.size(), 1u) << "merge_fn runs once, on replica 0";
  EXPECT_NE(trace.enclosing(*fns[0], "merge_call"), nullptr);
}

TEST_F(TimelineTest, PrefetchingIsTracedOnItsOwnThreadWithBytes) {
  MirroredStrategy strategy(cpus(2));
  const std::string path = file("input.json");
  timeline::start(path);
  // 8 rows of 3 floats in global batches of 4: two steps of 2 rows per replica.
  auto ds = data::from_tensor_slices(Tensor<float>::full({8, 3}, 1.0f)).batch(4);
  auto dist = strategy.experimental_distribute_dataset(ds);
  int steps = 0;
  for (const auto& step : dist) {
    strategy.run([](const Tensor<float>& x) { return x; }, step);
    ++steps;
  }
  EXPECT_EQ(steps, 2);
  timeline::stop();

  const Trace trace(path);
  std::vector<const Event*> produced;
  for (const Event* e : trace.named("prefetch")) {
    EXPECT_EQ(e->category, "input");
    EXPECT_EQ(trace.thread_name(e->tid), "prefetch");
    if (e->has("bytes")) produced.push_back(e);
  }
  ASSERT_EQ(produced.size(), 2u) << "one per step (the last call finds the end and carries no bytes)";
  for (const Event* e : produced) EXPECT_EQ(e->arg("bytes"), 2 * (2 * 3 * 4));  // two replicas' 2x3 floats
  EXPECT_EQ(produced[0]->arg("element"), 0);
  EXPECT_EQ(produced[1]->arg("element"), 1);
  const auto waits = trace.named("prefetch_wait");
  ASSERT_GE(waits.size(), 3u);  // two steps and the end
  for (const Event* e : waits) EXPECT_NE(trace.thread_name(e->tid), "prefetch");
}

TEST_F(TimelineTest, CheckpointSaveAndLoadCarryBytesAndTheEscapedPath) {
  // Every character JSON must escape, and a byte that is not UTF-8, in the file name.
  const std::string path = file("ck \"q\" \\ \t\x01 \xff.safetensors");
  const std::string trace_path = file("ckpt.json");
  timeline::start(trace_path);
  checkpoint::save_tensors(path, {{"w", checkpoint::untyped(Tensor<float>::full({10}, 2.0f))}});
  const auto loaded = checkpoint::load(path);
  EXPECT_EQ(loaded.names(), std::vector<std::string>{"w"});
  timeline::stop();

  const auto size = static_cast<int64_t>(fs::file_size(path));
  const Trace trace(trace_path);
  const auto saves = trace.named("checkpoint_save");
  const auto loads = trace.named("checkpoint_load");
  ASSERT_EQ(saves.size(), 1u);
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(saves[0]->arg("bytes"), size);
  EXPECT_EQ(saves[0]->arg("tensors"), 1);
  EXPECT_EQ(loads[0]->arg("bytes"), size);
  const std::string shown = file("ck \"q\" \\ \t\x01 \xEF\xBF\xBD.safetensors");  // U+FFFD for 0xff
  EXPECT_EQ(saves[0]->str("path"), shown);
  EXPECT_EQ(loads[0]->str("path"), shown);
  EXPECT_THAT(read_file(trace_path), HasSubstr("\\\"q\\\" \\\\ \\t\\u0001"));
}

TEST_F(TimelineTest, ThreadNamesAreEscaped) {
  const std::string path = file("names.json");
  timeline::start(path);
  int64_t tid = 0;
  std::thread t([&] {
    detail::timeline::name_this_thread("worker \"7\"\n\\ \x80");
    detail::timeline::Scope s("work", "test");
    tid = static_cast<int64_t>(::syscall(SYS_gettid));
  });
  t.join();
  timeline::stop();
  const Trace trace(path);
  ASSERT_EQ(trace.named("work").size(), 1u);
  EXPECT_EQ(trace.named("work")[0]->tid, tid);
  EXPECT_EQ(trace.thread_name(tid), "worker \"7\"\n\\ \xEF\xBF\xBD");
}

TEST_F(TimelineTest, AFullBufferLosesNoEvent) {
  // Far more events than one thread's ring holds, as fast as one thread can make them.
  constexpr int kEvents = 20000;
  const std::string path = file("full.json");
  timeline::start(path);
  for (int i = 0; i < kEvents; ++i) {
    detail::timeline::Scope s("tick", "test");
    s.arg("i", i);
  }
  timeline::stop();
  const Trace trace(path);
  const auto ticks = trace.named("tick");
  ASSERT_EQ(ticks.size(), std::size_t{kEvents});
  std::vector<int64_t> seen;
  for (const Event* e : ticks) seen.push_back(e->arg("i"));
  std::sort(seen.begin(), seen.end());
  for (int i = 0; i < kEvents; ++i) ASSERT_EQ(seen[i], i);
}

TEST_F(TimelineTest, EventsOfThreadsThatExitedAreWritten) {
  constexpr int kThreads = 12, kPerThread = 3;
  const std::string path = file("threads.json");
  timeline::start(path);
  for (int round = 0; round < 2; ++round) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads / 2; ++t)
      threads.emplace_back([] {
        for (int i = 0; i < kPerThread; ++i) detail::timeline::Scope s("short_lived", "test");
      });
    for (auto& t : threads) t.join();
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // the writer drops their buffers meanwhile
  }
  timeline::stop();
  const Trace trace(path);
  EXPECT_EQ(trace.named("short_lived").size(), std::size_t{kThreads * kPerThread});
}

TEST_F(TimelineTest, TimesAreSteadyClockNanosecondsAcrossWriterRounds) {
  // Events are stamped in ticks (the time-stamp counter where the kernel keeps time with it, else
  // the steady clock; util.timeline_steady_clock runs this with the steady clock) and converted
  // when written. Sleeps measured with the steady clock must come out as their lengths, also for
  // events written in different rounds of the writer (it wakes every 100 ms), and nest.
  using Clock = std::chrono::steady_clock;
  const std::string path = file("trace.json");
  timeline::start(path);
  const auto t0 = Clock::now();
  Clock::duration outer_wall{}, inner_wall{};
  {
    detail::timeline::Scope outer("outer", "test");
    const auto o0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    {
      detail::timeline::Scope inner("inner", "test");
      const auto i0 = Clock::now();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      inner_wall = Clock::now() - i0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // the writer writes "inner" meanwhile
    outer_wall = Clock::now() - o0;
  }
  const auto gap = Clock::now() - t0;
  { detail::timeline::Scope last("last", "test"); }
  timeline::stop();

  const Trace trace(path);
  trace.check_nesting();
  const auto ns = [](Clock::duration d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(); };
  const auto outer = trace.named("outer"), inner = trace.named("inner"), last = trace.named("last");
  ASSERT_EQ(outer.size(), 1u);
  ASSERT_EQ(inner.size(), 1u);
  ASSERT_EQ(last.size(), 1u);
  // Each span lies between the sleep it holds and the steady-clock time around it (2 ms of slack
  // for the clock reads around the scope's own).
  EXPECT_GE(inner[0]->dur_ns, 20'000'000);
  EXPECT_LE(inner[0]->dur_ns, ns(inner_wall) + 2'000'000);
  EXPECT_GE(outer[0]->dur_ns, 300'000'000);
  EXPECT_LE(outer[0]->dur_ns, ns(outer_wall) + 2'000'000);
  EXPECT_NE(trace.enclosing(*inner[0], "outer"), nullptr);
  EXPECT_GE(last[0]->ts_ns - outer[0]->ts_ns, ns(gap) - 2'000'000);
  EXPECT_LE(last[0]->ts_ns - outer[0]->ts_ns, ns(gap) + 2'000'000);
}

TEST_F(TimelineTest, EachReplicasRunsFollowOneAnotherInStepOrder) {
  // A run's event begins when the run is handed out and ends after the replica has signalled its
  // end, and the next run may be handed out before that: a replica's events must still not overlap.
  constexpr int kReplicas = 2, kRuns = 300;
  MirroredStrategy strategy(cpus(kReplicas));
  const std::string path = file("steps.json");
  timeline::start(path);
  for (int i = 0; i < kRuns; ++i) strategy.run([] {});
  timeline::stop();
  const Trace trace(path);
  std::map<int64_t, std::vector<const Event*>> by_tid;
  for (const Event* e : trace.named("run")) by_tid[e->tid].push_back(e);
  ASSERT_EQ(by_tid.size(), std::size_t{kReplicas});
  for (auto& [tid, runs] : by_tid) {
    ASSERT_EQ(runs.size(), std::size_t{kRuns});
    std::sort(runs.begin(), runs.end(), [](const Event* a, const Event* b) { return a->arg("step") < b->arg("step"); });
    for (int i = 1; i < kRuns; ++i) {
      EXPECT_GE(runs[i]->ts_ns, runs[i - 1]->ts_ns + runs[i - 1]->dur_ns)
          << "run " << runs[i]->arg("step") << " begins before run " << runs[i - 1]->arg("step") << " ends";
    }
  }
}

TEST_F(TimelineTest, StopWaitsForADeferredSpanSealedBeforeIt) {
  // A replica's run is appended after the replica has told the caller it is done; the caller may
  // stop the timeline straight away. Here the thread appends 100 ms after its signal.
  const std::string path = file("deferred.json");
  timeline::start(path);
  std::atomic<bool> opened{false};
  std::thread t([&] {
    const std::int64_t begin = detail::timeline::now_ticks();
    detail::timeline::DeferredSpan span("late", "test");
    span.arg("k", 7);
    { detail::timeline::Scope inner("inner", "test"); }
    detail::timeline::seal_deferred();
    opened.store(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(detail::timeline::deferred_open());
    detail::timeline::commit_deferred(begin);
    EXPECT_FALSE(detail::timeline::deferred_open());
  });
  while (!opened.load()) std::this_thread::yield();
  timeline::stop();
  t.join();
  const Trace trace(path);
  trace.check_nesting();
  const auto late = trace.named("late");
  ASSERT_EQ(late.size(), 1u) << "stop waited for the span sealed before it";
  EXPECT_EQ(late[0]->arg("k"), 7);
  EXPECT_GE(late[0]->dur_ns, 100'000'000);
  ASSERT_EQ(trace.named("inner").size(), 1u);
  EXPECT_NE(trace.enclosing(*trace.named("inner")[0], "late"), nullptr);
}

TEST_F(TimelineTest, ADeferredSpanEnclosesTheEventsInsideIt) {
  // A replica may start its part before the caller has stamped the hand-out: the run event must
  // still begin no later than the collectives inside it.
  const std::string path = file("enclose.json");
  timeline::start(path);
  {
    detail::timeline::DeferredSpan span("outer", "test");
    { detail::timeline::Scope inner("inner", "test"); }
    const std::int64_t late_stamp = detail::timeline::now_ticks();  // after "inner" began
    detail::timeline::commit_deferred(late_stamp);
  }
  {
    detail::timeline::DeferredSpan span("unstamped", "test");
    { detail::timeline::Scope inner("inner2", "test"); }
    detail::timeline::commit_deferred(-1);
  }
  timeline::stop();
  const Trace trace(path);  // checks that the thread's events nest
  ASSERT_EQ(trace.named("inner").size(), 1u);
  EXPECT_NE(trace.enclosing(*trace.named("inner")[0], "outer"), nullptr);
  ASSERT_EQ(trace.named("inner2").size(), 1u);
  EXPECT_NE(trace.enclosing(*trace.named("inner2")[0], "unstamped"), nullptr);
}

TEST_F(TimelineTest, ASealedSpanNeverAppendedHoldsStopForItsBoundOnly) {
  const std::string path = file("abandoned.json");
  timeline::start(path);
  std::atomic<bool> opened{false}, stopped{false};
  std::thread t([&] {
    const std::int64_t begin = detail::timeline::now_ticks();
    detail::timeline::DeferredSpan span("abandoned", "test");
    detail::timeline::seal_deferred();
    opened.store(true);
    while (!stopped.load()) std::this_thread::yield();
    detail::timeline::commit_deferred(begin);  // after the stop: goes nowhere, harmlessly
    // The thread records into the next timeline as usual; a span whose beginning is not known
    // begins at its end.
    timeline::start(file("next.json"));
    { detail::timeline::DeferredSpan next("next", "test"); }
    detail::timeline::commit_deferred(-1);
    timeline::stop();
  });
  while (!opened.load()) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  timeline::stop();  // gives up on the span after its bound (1 s)
  const auto waited = std::chrono::steady_clock::now() - t0;
  stopped.store(true);
  EXPECT_GE(waited, std::chrono::milliseconds(900)) << "stop waited for the sealed span";
  EXPECT_LT(waited, std::chrono::seconds(30)) << "and gave up on it";
  t.join();
  EXPECT_TRUE(Trace(path).named("abandoned").empty());
  const Trace next(file("next.json"));
  ASSERT_EQ(next.named("next").size(), 1u);
  EXPECT_EQ(next.named("next")[0]->dur_ns, 0);
}

TEST_F(TimelineTest, OffRecordsNothing) {
  EXPECT_FALSE(timeline::active());
  detail::timeline::Scope s("nothing", "test");
  EXPECT_FALSE(s.active());
}

}  // namespace
}  // namespace mirrored::timeline_test
