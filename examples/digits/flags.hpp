#pragma once
// train_digits' flags: what its command line asks for, parsed with CLI11 in a translation unit of
// its own (flags.cpp), so that the training program's does not compile CLI11 as well.

#include <string>
#include <vector>

#include "common/distribution_flags.hpp"
#include "digits/digits_data.hpp"
#include "digits/train.hpp"

namespace digits {

/// What train_digits' command line asks for (see train_digits.cpp's comment for the flags).
struct Args {
  std::vector<std::string> devices;
  examples::DistributionFlags distribution;  // --strategy, --compression, --timeline
  TrainConfig cfg;
  std::string data = default_digits_path();
  std::string save;
  bool verbose = false;
};

/// Parses train_digits' flags (`--flag value` or `--flag=value`). A mistake costs no training time:
/// nothing is printed before they are checked. `--help` prints every flag with its default and
/// exits 0; a usage error prints a message naming the flag and exits 2.
Args parse_args(int argc, char** argv);

}  // namespace digits
