// The validators of gpt_train's flags: a range, a number's bound, a device name (command_line.h).
#include "command_line.h"

#include "search_flags.h"
#include "tensor_parallel_plan.h"

#include "data.h"
#include "gpt.h"
#include "hf_folder.h"
#include "model_family.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <torch/cuda.h>
#include <unistd.h>


namespace gpt {

namespace {

std::string in_parentheses(const std::string& hint) {
  return hint.empty() ? "" : " (" + hint + ")";
}

}  // namespace

CLI::Validator integer_in(int64_t lo, int64_t hi, std::string hint) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long value = std::strtoll(text.c_str(), &end, 10);
        const bool whole = !text.empty() && end == text.c_str() + text.size() && errno == 0;
        if (whole && value >= lo && value <= hi) return "";
        std::string range = hi == std::numeric_limits<int64_t>::max()
                                ? ">= " + std::to_string(lo)
                                : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
        return "must be a whole number " + range + ", got '" + text + "'" + in_parentheses(hint);
      },
      "INT", "integer_in");
}

namespace {

// A finite number that `accepts`, else the message naming `range` (e.g. ">= 0").
CLI::Validator real_where(std::function<bool(double)> accepts, const std::string& range,
                          const std::string& hint, const char* name) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        const bool number = !text.empty() && end == text.c_str() + text.size();
        if (number && std::isfinite(value) && accepts(value)) return "";
        return "must be a finite number " + range + ", got '" + text.substr(0, 40) + "'" +
               in_parentheses(hint);
      },
      "REAL", name);
}

std::string number_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

}  // namespace

CLI::Validator real_at_least(double lo, bool strictly_above, std::string hint) {
  return real_where([=](double value) { return strictly_above ? value > lo : value >= lo; },
                    (strictly_above ? "> " : ">= ") + number_text(lo), hint, "real_at_least");
}

CLI::Validator real_in(double lo, double hi, std::string hint) {
  return real_where([=](double value) { return value >= lo && value <= hi; },
                    "in [" + number_text(lo) + ", " + number_text(hi) + "]", hint, "real_in");
}

CLI::Validator device_name() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text == "cpu" || text == "cuda") return "";
        const std::string index = text.rfind("cuda:", 0) == 0 ? text.substr(5) : "";
        const bool whole = !index.empty() && index.size() <= 4 &&
                           index.find_first_not_of("0123456789") == std::string::npos;
        return whole ? "" : "must be cpu, cuda or cuda:N (N: a GPU's index), got '" + text + "'";
      },
      "DEVICE", "device_name");
}

}  // namespace gpt
