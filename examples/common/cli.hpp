#pragma once
/// \file
/// What the example programs' command lines share (train_digits, fashion_mnist): CLI11 validators
/// that add no text of their own to --help, number checks, and the report of a stray argument.
/// Header-only; needs CLI11 (Debian `libcli11-dev`), which only the examples use.

#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/distribution_flags.hpp"

namespace examples {

/// A CLI11 validator (no text of its own in --help): `ok(value)` says whether the value is good;
/// otherwise the error is "<what>, got '<value>'".
template <class Ok>
CLI::Validator must_be(const std::string& what, Ok ok) {
  return CLI::Validator([=](std::string& v) { return ok(v) ? std::string() : what + ", got '" + v + "'"; }, "");
}

/// Whether `v` is a non-empty run of decimal digits (no sign, no spaces).
inline bool is_uint(const std::string& v) {
  return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
}

/// Whether all of `v` is a number of type T (in range); it is stored in `out`.
template <class T>
bool converts(const std::string& v, T& out) {
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc() && end == v.data() + v.size();
}

/// A validator for an integer of type T that is at least `min` (0: "a non-negative integer",
/// otherwise "a positive integer" as the message says).
template <class T>
CLI::Validator integer_at_least(T min) {
  return must_be(min > 0 ? "must be a positive integer" : "must be a non-negative integer",
                 [min](const std::string& v) {
                   T x{};
                   return is_uint(v) && converts(v, x) && x >= min;
                 });
}

/// A validator for a finite number above 0 ("must be a positive finite number").
inline CLI::Validator positive_finite_number() {
  return must_be("must be a positive finite number", [](const std::string& v) {
    double x = 0;
    return converts(v, x) && std::isfinite(x) && x > 0;
  });
}

/// A validator for one of `choices` ("must be a, b or c").
inline CLI::Validator one_of(const std::vector<std::string>& choices) {
  std::string what = "must be ";
  for (std::size_t i = 0; i < choices.size(); ++i)
    what += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  return must_be(what, [choices](const std::string& v) {
    for (const auto& c : choices)
      if (v == c) return true;
    return false;
  });
}

/// A validator for a path whose directory exists (the file itself need not).
inline CLI::Validator in_existing_directory() {
  return must_be("must be in an existing directory", [](const std::string& v) {
    const std::filesystem::path dir = std::filesystem::path(v).parent_path();
    std::error_code ec;
    return dir.empty() || std::filesystem::is_directory(dir, ec);
  });
}

/// `text (default: value)`, for --help.
template <class V>
std::string with_default(const std::string& text, const V& value) {
  std::ostringstream os;
  os << text << " (default: " << value << ")";
  return os.str();
}

/// The items of a comma-separated list ("CPU:0,CPU:1").
inline std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

/// After `app.parse` of an app that `allow_extras()`: the first argument it did not take, as
/// "unknown flag --x" or "unexpected argument 'x'", in the order given (CLI11 lists them reversed).
/// \throws CLI::ExtrasError when there is one.
inline void reject_extras(const CLI::App& app) {
  if (const auto extra = app.remaining(); !extra.empty()) {
    throw CLI::ExtrasError(
        extra[0].rfind('-', 0) == 0 ? "unknown flag " + extra[0] : "unexpected argument '" + extra[0] + "'",
        CLI::ExitCodes::ExtrasError);
  }
}

/// Adds --strategy NAME, --compression NAME and --timeline PATH, stored in `f`.
inline void add_distribution_flags(CLI::App& app, DistributionFlags& f) {
  app.add_option(
         "--strategy", f.strategy,
         with_default("mirrored, or multi_worker for the workers of the launcher that started it (tools/launch.sh, "
                      "torchrun, mpirun, srun)",
                      f.strategy))
      ->type_name("NAME")
      ->check(one_of({"mirrored", "multi_worker"}));
  app.add_option(
         "--compression", f.compression,
         with_default("How gradients cross workers: none, fp16 or bf16 (--strategy multi_worker)", f.compression))
      ->type_name("NAME")
      ->check(one_of({"none", "fp16", "bf16"}));
  app.add_option("--timeline", f.timeline,
                 "Write a timeline of the training (open it in ui.perfetto.dev) to this JSON file (default: none)")
      ->type_name("PATH")
      ->check(in_existing_directory());
}

}  // namespace examples
