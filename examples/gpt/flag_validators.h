#pragma once
// gpt_train's checks of a flag's text before CLI11 converts it, so that a negative count, a NaN
// or an infinity is refused before any work with a message that names the flag (CLI11 prefixes
// the flag's name: "--lr: must be a finite number >= 0, got 'inf'").

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace gpt {

constexpr int64_t kMaxCount = int64_t(1) << 40;  // steps and the like: far beyond any real run

/// A whole number in [lo, hi]; `hint`, when given, ends the message in parentheses.
CLI::Validator integer_in(int64_t lo, int64_t hi, std::string hint = "");

/// A finite number >= lo (> lo when `strictly_above`).
CLI::Validator real_at_least(double lo, bool strictly_above = false, std::string hint = "");

/// A finite number in [lo, hi]: a rate or a size whose absurd values (1e-300 TFLOP/s, 1e300
/// GiB) would print as 300-digit times or "inf GiB".
CLI::Validator real_in(double lo, double hi, std::string hint = "");

/// --device: "cpu", "cuda" or "cuda:N".
CLI::Validator device_name();

}  // namespace gpt
