// mirrored_bed_elastic_ids: the job that tests/bed/bed_elastic.sh runs under torchrun's elastic
// agents, which records every example it consumes. A linear regression on integer-valued
// examples trained with MultiWorkerMirroredStrategy, its cluster found by
// cluster_resolver_from_environment() (torchrun's variables, TF_CONFIG under tools/launch.sh, or
// one local worker), over range(N) shuffled per epoch, batched to a fixed global batch G and
// auto-sharded (DATA: each replica its slice of every global batch). A CheckpointManager saves the
// weights, SGD's step counter and the iterator every S steps (PreemptionCheckpointHandler), and
// each start restores the newest checkpoint on whatever number of workers the launcher gave.
//
// Each worker appends to RECORD/<attempt>.<worker> (attempt: TORCHELASTIC_RESTART_COUNT, else 0),
// one write(2) per line so that a killed worker leaves whole lines:
//   start <attempt> worker <w> of <W> restored <K> launched <unix s> ready <unix s>
//   step <s> epoch <e> replica <r> of <N> loss <hex double> ids <id>,<id>,...
//       written by each replica when its update of global step s (1-based) is done, before the
//       step's checkpoint: a checkpoint of step s exists only if every worker wrote its lines of
//       steps <= s. <loss> is the replica's own sum of squared errors / 2 over its ids, before the
//       update (bitwise the same for the same replica slices and weights).
//   end <attempt> worker <w> status <0|75|1> at <unix s> [error]
// The chief of a run that finished writes RESULT: "final_loss <%.17g>" (the mean of (w.x + b -
// y)^2 / 2 over all N examples with the final weights, in double, in id order) and the weights.
//
// Exit status: 0 finished; 75 when a peer was lost (UNAVAILABLE, DEADLINE_EXCEEDED: the launcher
// restarts the job, which resumes from the newest checkpoint); 1 another error; 2 a usage error.
//
//   mirrored_bed_elastic_ids --checkpoint-dir DIR --record DIR [--result FILE] [--examples N]
//       [--global-batch G] [--epochs E] [--save-every-steps S]
//       [--step-ms MS (sleep after each step: lets a test fault mid-epoch)]
//       [--drop-step S (global step S applies no update: a batch lost, the negative control of
//        the loss comparison)]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <mirrored/checkpoint_manager.hpp>
#include <mirrored/mirrored.hpp>
#include <mirrored/preemption_checkpoint_handler.hpp>

using namespace mirrored;

namespace {

constexpr int kFeatures = 4;
// The regression's true weights and bias; each example's target adds an integer noise in -2..2,
// so that no weights fit every example and the loss keeps depending on which examples were seen.
constexpr float kTrueW[kFeatures] = {3, -2, 1, 5};
constexpr float kTrueB = 1;
// Small enough that 4 epochs end far from the optimum (the loss still depends on every batch).
constexpr double kLearningRate = 0.002;

float feature(int64_t id, int j) {
  uint64_t h = static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(j + 1) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  return static_cast<float>(static_cast<int>(h % 9) - 4);
}
float target(int64_t id) {
  float y = kTrueB + static_cast<float>(static_cast<int>(static_cast<uint64_t>(id) * 7919u % 5) - 2);
  for (int j = 0; j < kFeatures; ++j) y += kTrueW[j] * feature(id, j);
  return y;
}

struct Options {
  std::string checkpoint_dir, record_dir, result;
  int64_t examples = 600, global_batch = 24, epochs = 4, save_every = 5, step_ms = 0, drop_step = -1;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "mirrored_bed_elastic_ids: " << why
            << "\nusage: mirrored_bed_elastic_ids --checkpoint-dir DIR --record DIR [--result FILE] [--examples N]"
               " [--global-batch G] [--epochs E] [--save-every-steps S] [--step-ms MS]"
               " [--drop-step S]\n";
  std::exit(2);
}

int64_t whole(const std::string& flag, const char* v) {
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (*v == '\0' || *end != '\0' || x < 0) usage(flag + " takes a non-negative integer, got '" + v + "'");
  return x;
}

Options parse(int argc, char** argv) {
  Options o;
  const std::map<std::string, std::string*> text{
      {"--checkpoint-dir", &o.checkpoint_dir}, {"--record", &o.record_dir}, {"--result", &o.result}};
  const std::map<std::string, int64_t*> number{{"--examples", &o.examples}, {"--global-batch", &o.global_batch},
                                               {"--epochs", &o.epochs},     {"--save-every-steps", &o.save_every},
                                               {"--step-ms", &o.step_ms},   {"--drop-step", &o.drop_step}};
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    if (const auto t = text.find(flag); t != text.end())
      *t->second = argv[i + 1];
    else if (const auto n = number.find(flag); n != number.end())
      *n->second = whole(flag, argv[i + 1]);
    else
      usage("unknown flag " + flag);
  }
  if (o.checkpoint_dir.empty() || o.record_dir.empty()) usage("--checkpoint-dir and --record are required");
  // Every global batch full: the global batch size of every step is G, before and after a restart.
  if (o.global_batch < 1 || o.examples % o.global_batch != 0 || o.epochs < 1)
    usage("--examples must be a multiple of --global-batch, and --epochs at least 1");
  return o;
}

double unix_seconds() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// A worker's record file: whole lines appended with one write each.
class Record {
 public:
  explicit Record(const std::string& path) : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644)) {
    if (fd_ < 0) throw InvalidArgumentError("mirrored_bed_elastic_ids: cannot open the record " + path);
  }
  ~Record() { ::close(fd_); }
  Record(const Record&) = delete;
  Record& operator=(const Record&) = delete;
  void line(std::string text) const {
    text += '\n';
    if (::write(fd_, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
      std::perror("mirrored_bed_elastic_ids: writing the record");
  }

 private:
  int fd_;
};

std::string format(const char* fmt, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

int train(const Options& o, const std::string& launched, int& worker, int& attempt, std::unique_ptr<Record>& record) {
  const auto resolver = cluster_resolver_from_environment();
  if (const auto* torchrun = dynamic_cast<const TorchrunClusterResolver*>(resolver.get()))
    attempt = torchrun->restart_count();
  MultiWorkerMirroredStrategy strategy(CommunicationOptions{}, resolver, {"CPU:0"});
  worker = strategy.extended().worker_index();
  const int workers = strategy.extended().num_workers();
  const int replicas = strategy.num_replicas_in_sync();
  record = std::make_unique<Record>(o.record_dir + "/" + std::to_string(attempt) + "." + std::to_string(worker));

  std::vector<Variable<float>> vars;
  optimizers::SGD<float> opt(optimizers::SGDOptions{.learning_rate = kLearningRate});
  {
    auto scope = strategy.scope();
    vars.emplace_back(Tensor<float>::zeros({kFeatures}), VariableOptions{.name = "w"});
    vars.emplace_back(Tensor<float>::zeros({1}), VariableOptions{.name = "b"});
    opt.build(vars);
  }
  const int64_t steps_per_epoch = o.examples / o.global_batch, total = steps_per_epoch * o.epochs;
  const auto dataset = data::range(o.examples).shuffle(o.examples, 11).batch(o.global_batch).repeat(o.epochs);
  auto input = strategy.experimental_distribute_dataset(dataset).begin();
  checkpoint::CheckpointManager manager(strategy, o.checkpoint_dir, /*max_to_keep=*/3);
  manager.track("w", vars[0]);
  manager.track("b", vars[1]);
  manager.track("optimizer", opt);
  manager.track("input", input);
  PreemptionCheckpointHandler handler(strategy, manager, o.save_every);  // restores the newest checkpoint
  const int64_t restored = handler.total_run_calls();
  record->line("start " + std::to_string(attempt) + " worker " + std::to_string(worker) + " of " +
               std::to_string(workers) + " restored " + std::to_string(restored) + " launched " + launched +
               format(" ready %.3f", unix_seconds()));
  std::cout << "worker " << worker << " of " << workers << ", attempt " << attempt << ": from step " << restored
            << " of " << total << std::endl;

  // One replica's step `s`: the gradients of its squared errors / G, all-reduced and applied.
  auto step_fn = [&](const Tensor<int64_t>& ids, int64_t s) {
    const std::vector<float> w = vars[0].value().to_vector(), b = vars[1].value().to_vector();
    std::vector<float> gw(kFeatures, 0.0f), gb(1, 0.0f);
    double loss = 0;
    std::string list;
    for (int64_t id : ids.to_vector()) {
      float pred = b[0];
      for (int j = 0; j < kFeatures; ++j) pred += w[j] * feature(id, j);
      const float r = pred - target(id);
      loss += 0.5 * static_cast<double>(r) * static_cast<double>(r);
      for (int j = 0; j < kFeatures; ++j) gw[j] += r * feature(id, j);
      gb[0] += r;
      list += (list.empty() ? "" : ",") + std::to_string(id);
    }
    const float scale = s == o.drop_step ? 0.0f : 1.0f / static_cast<float>(o.global_batch);
    for (float& g : gw) g *= scale;
    gb[0] *= scale;
    opt.apply_gradients(
        {{Tensor<float>::from_vector(gw, {kFeatures}), vars[0]}, {Tensor<float>::from_vector(gb, {1}), vars[1]}});
    const int r = get_replica_context()->replica_id_in_sync_group();
    record->line(format("step %" PRId64 " epoch %" PRId64 " replica %d of %d loss %a ids ", s,
                        (s - 1) / steps_per_epoch + 1, r, replicas, loss) +
                 list);
  };
  while (handler.total_run_calls() < total) {
    auto batch = input.get_next_as_optional();
    if (!batch)
      throw InternalError("mirrored_bed_elastic_ids: the input ended before step " +
                          std::to_string(handler.total_run_calls() + 1) + " of " + std::to_string(total));
    handler.run(step_fn, *batch, handler.total_run_calls() + 1);
    if (o.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.step_ms));
  }
  if (worker == 0 && !o.result.empty()) {
    const std::vector<float> w = vars[0].value().to_vector(), b = vars[1].value().to_vector();
    double sum = 0;
    for (int64_t id = 0; id < o.examples; ++id) {
      double pred = b[0];
      for (int j = 0; j < kFeatures; ++j) pred += static_cast<double>(w[j]) * feature(id, j);
      sum += 0.5 * (pred - target(id)) * (pred - target(id));
    }
    std::ofstream out(o.result);
    out << format("final_loss %.17g\n", sum / static_cast<double>(o.examples))
        << format("weights %a %a %a %a %a\n", w[0], w[1], w[2], w[3], b[0]);
    if (!out.flush()) throw InvalidArgumentError("mirrored_bed_elastic_ids: cannot write " + o.result);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const std::string launched = format("%.3f", unix_seconds());
  int worker = -1, attempt = 0, status = 0;
  std::unique_ptr<Record> record;
  std::string error;
  try {
    status = train(o, launched, worker, attempt, record);
  } catch (const Error& e) {
    // A lost peer: exit 75 so that the launcher restarts the job from its newest checkpoint.
    const bool lost = e.code() == ErrorCode::UNAVAILABLE || e.code() == ErrorCode::DEADLINE_EXCEEDED;
    status = lost ? PreemptionCheckpointHandler::kRestartExitCode : 1;
    error = std::string(error_code_name(e.code())) + ": " + e.what();
    std::cerr << "mirrored_bed_elastic_ids: " << error << std::endl;
  }
  if (record) {
    for (char& c : error)
      if (c == '\n') c = ' ';
    record->line(format("end %d worker %d status %d at %.3f ", attempt, worker, status, unix_seconds()) + error);
  }
  return status;
}
