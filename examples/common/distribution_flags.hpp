#pragma once
/// \file
/// What an example that runs on several workers asks for on its command line (--strategy,
/// --compression, --timeline), apart from CLI11, which parses it (cli.hpp's
/// `add_distribution_flags`): a program's training code includes this header, only its flags file
/// compiles CLI11.

#include <string>

#include <mirrored/communication_options.hpp>

namespace examples {

/// The flags of an example that runs on several workers and records timelines: --strategy,
/// --compression (how gradients cross workers) and --timeline (see `add_distribution_flags`).
struct DistributionFlags {
  std::string strategy = "mirrored";  ///< "mirrored" or "multi_worker" (examples::make_strategy)
  std::string compression = "none";   ///< "none", "fp16" or "bf16"
  std::string timeline;               ///< a JSON file for mirrored::timeline, or empty
  mirrored::Compression compression_kind() const {
    return compression == "fp16"   ? mirrored::Compression::FP16
           : compression == "bf16" ? mirrored::Compression::BF16
                                   : mirrored::Compression::NONE;
  }
};

}  // namespace examples
