// The simulated GPU's streams and events.
#include "device/simulated/sim_stream.hpp"

#include <cmath>
#include <exception>

#include "mirrored/errors.hpp"

namespace mirrored::detail::sim {

Stream::Stream(std::string name, uint64_t seed, int max_delay_us, std::function<void(const std::string&)> on_failure)
    : name_(std::move(name)),
      max_delay_us_(max_delay_us),
      on_failure_(std::move(on_failure)),
      rng_(seed ^ std::hash<std::string>{}(name_)) {
  worker_ = std::thread([this] { run(); });
}

Stream::~Stream() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    holds_ = 0;
  }
  work_cv_.notify_all();
  worker_.join();
}

uint64_t Stream::enqueue(std::function<void()> work) {
  uint64_t ticket;
  {
    std::lock_guard lock(mu_);
    ticket = ++enqueued_;
    queue_.emplace_back(ticket, std::move(work));
  }
  work_cv_.notify_one();
  return ticket;
}

uint64_t Stream::last_ticket() const {
  std::lock_guard lock(mu_);
  return enqueued_;
}

bool Stream::reached(uint64_t ticket) const {
  std::lock_guard lock(mu_);
  return completed_ >= ticket;
}

bool Stream::wait(uint64_t ticket, Clock::time_point deadline) const {
  std::unique_lock lock(mu_);
  auto done = [&] { return completed_ >= ticket; };
  if (deadline == Clock::time_point::max()) {
    done_cv_.wait(lock, done);
    return true;
  }
  return done_cv_.wait_until(lock, deadline, done);
}

std::string Stream::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

void Stream::delay_next(std::chrono::milliseconds delay) {
  std::lock_guard lock(mu_);
  not_before_ = Clock::now() + delay;
}

void Stream::hold() {
  std::lock_guard lock(mu_);
  ++holds_;
}

void Stream::release() {
  {
    std::lock_guard lock(mu_);
    if (holds_ > 0) --holds_;
  }
  work_cv_.notify_all();
}

void Stream::run() {
  std::unique_lock lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && holds_ == 0); });
    if (queue_.empty()) return;  // stopping, and everything queued has run
    auto [ticket, work] = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !failure_.empty();
    const Clock::time_point not_before = std::exchange(not_before_, Clock::time_point{});
    lock.unlock();
    std::string failed;
    if (!skip) {
      // The random delay: the host, which does not wait, runs ahead of the device.
      if (max_delay_us_ > 0 && (rng_() & 3) == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(rng_() % static_cast<uint64_t>(max_delay_us_)));
      if (not_before != Clock::time_point{}) std::this_thread::sleep_until(not_before);
      try {
        work();
      } catch (const std::exception& e) {
        failed = e.what();
      } catch (...) {
        failed = "unknown exception";
      }
    }
    work = nullptr;  // what it captured goes away before the work counts as finished
    if (!failed.empty()) {
      // The stream's own failure is set before the chip is marked unusable: a synchronize that
      // sees the chip refused must also see the failure, and report it (CUDA's sticky error goes
      // to the first call that waits, not a refusal).
      lock.lock();
      if (failure_.empty()) failure_ = failed;
      lock.unlock();
      if (on_failure_) on_failure_(failed);
    }
    lock.lock();
    completed_ = ticket;
    done_cv_.notify_all();
  }
}

void Event::record(const Stream& stream) {
  const uint64_t ticket = stream.last_ticket();
  std::lock_guard lock(mu_);
  stream_ = &stream;
  ticket_ = ticket;
}

std::pair<const Stream*, uint64_t> Event::latest() const {
  std::lock_guard lock(mu_);
  return {stream_, ticket_};
}

bool Event::query() const {
  const auto [stream, ticket] = latest();
  return !stream || stream->reached(ticket);
}

void Event::synchronize(const Deadline& deadline) const {
  const auto [stream, ticket] = latest();
  if (!stream) return;
  if (counts_) counts_->count_host_sync();
  if (!stream->wait(ticket, deadline.time_point())) {
    throw DeadlineExceededError(str_cat("event synchronize on ", owner_, ": the work on the simulated ", stream->name(),
                                        " before the event did not finish within ", deadline.timeout_seconds(), " s"));
  }
  const std::string failure = stream->failure();
  MIRRORED_ENFORCE(failure.empty(), InternalError, "event synchronize on ", owner_, ": the simulated ", stream->name(),
                   " failed: ", failure);
}

}  // namespace mirrored::detail::sim
