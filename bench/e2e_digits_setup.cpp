// What bench/e2e_digits.py gives TensorFlow and PyTorch so that they train train_digits' model on
// the same data in the same order from the same weights: writes one JSON file with
//
//   train_rows, test_rows  digits::split_digits' held-out split (rows of data/digits.csv.gz)
//   epoch_orders           for each epoch, the order in which train_digits' input pipeline
//                          (`shuffle(train_n, seed)` of the training set) visits the training set,
//                          as positions in train_rows
//   init                   digits::init_mlp's initial weights (float32, "%.9g": exact)
//
//   e2e_digits_setup OUT.json [--epochs 20] [--seed 0] [--test-fraction 0.2] [--data PATH]
//
// The orders come from the same library shuffle over `range(train_n)`: its order depends on the seed,
// the buffer size, the element count and the epoch only. The program checks that, epoch by epoch,
// against the shuffled training set itself (features and labels), as train_digits builds it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "digits/digits_data.hpp"
#include "digits/mlp.hpp"
#include "digits/train.hpp"

namespace {

template <class T>
void write_list(std::ostream& os, const std::vector<T>& v) {
  os << '[';
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << ']';
}

void write_floats(std::ostream& os, const std::vector<float>& v) {
  os << '[';
  char buf[32];
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v[i]));
    os << (i ? "," : "") << buf;
  }
  os << ']';
}

[[noreturn]] void usage(const char* msg) {
  std::cerr << "e2e_digits_setup: " << msg
            << "\nusage: e2e_digits_setup OUT.json [--epochs N] [--seed N] [--test-fraction X] [--data PATH]\n";
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  digits::TrainConfig cfg;  // train_digits' defaults
  std::string out, data = digits::default_digits_path();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--epochs")
      cfg.epochs = std::atoi(value().c_str());
    else if (a == "--seed")
      cfg.seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--test-fraction")
      cfg.test_fraction = std::atof(value().c_str());
    else if (a == "--data")
      data = value();
    else if (!a.empty() && a[0] != '-' && out.empty())
      out = a;
    else
      usage(("unexpected argument " + a).c_str());
  }
  if (out.empty()) usage("no output file");
  if (cfg.epochs < 1) usage("--epochs must be at least 1");

  const digits::Split split = digits::split_digits(digits::load_digits(data), cfg.test_fraction, cfg.seed);
  const int64_t n = split.train.size();

  // The orders, and the check that they are the orders of the shuffled training set itself.
  const auto order_ds = mirrored::data::Dataset<>::range(n).shuffle(n, cfg.seed);
  const auto train_ds =
      mirrored::data::Dataset<>::from_tensor_slices(split.train.features, split.train.labels).shuffle(n, cfg.seed);
  const float* x = split.train.features.data();
  const int32_t* y = split.train.labels.data();
  std::vector<std::vector<int64_t>> orders;
  for (int e = 0; e < cfg.epochs; ++e) {
    std::vector<int64_t> order;
    for (const auto& t : order_ds) order.push_back(t.item());
    std::size_t k = 0;
    for (const auto& [fx, fy] : train_ds) {
      const int64_t r = k < order.size() ? order[k] : -1;
      if (r < 0 || fy.item() != y[r] ||
          std::memcmp(fx.data(), x + r * digits::kFeatures, sizeof(float) * digits::kFeatures)) {
        std::cerr << "e2e_digits_setup: epoch " << e + 1 << ", element " << k
                  << ": the order of range(n).shuffle differs from the shuffled training set's\n";
        return 1;
      }
      ++k;
    }
    if (k != order.size() || static_cast<int64_t>(k) != n) {
      std::cerr << "e2e_digits_setup: epoch " << e + 1 << " has " << k << " elements, expected " << n << "\n";
      return 1;
    }
    orders.push_back(std::move(order));
  }

  const digits::MlpParams init = digits::init_mlp<float>(cfg.seed);
  std::ofstream os(out);
  os << "{\"seed\":" << cfg.seed << ",\"test_fraction\":" << cfg.test_fraction << ",\"epochs\":" << cfg.epochs
     << ",\"features\":" << digits::kFeatures << ",\n\"train_rows\":";
  write_list(os, split.train_rows);
  os << ",\n\"test_rows\":";
  write_list(os, split.test_rows);
  os << ",\n\"epoch_orders\":[";
  for (std::size_t e = 0; e < orders.size(); ++e) {
    os << (e ? ",\n" : "\n");
    write_list(os, orders[e]);
  }
  os << "],\n\"init\":{";
  const auto names = digits::MlpParams::names();
  const auto tensors = init.tensors();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    os << (i ? ",\n" : "\n") << '"' << names[i] << "\":{\"shape\":";
    write_list(os, tensors[i].shape());
    os << ",\"values\":";
    write_floats(os, tensors[i].to_vector());
    os << '}';
  }
  os << "}}\n";
  os.close();
  if (!os) {
    std::cerr << "e2e_digits_setup: cannot write " << out << "\n";
    return 1;
  }
  std::printf("e2e_digits_setup: wrote %s (%lld training and %lld held-out examples, %d epochs, seed %llu)\n",
              out.c_str(), static_cast<long long>(n), static_cast<long long>(split.test.size()), cfg.epochs,
              static_cast<unsigned long long>(cfg.seed));
  return 0;
}
