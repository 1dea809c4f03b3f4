#include "saved_freeze.h"

#include "trainer.h"

#include <c10/util/Exception.h>

namespace gpt {

namespace {

// The --freeze pattern that matches `name` ("" when none does).
std::string freezing_pattern(const TrainOptions& o, const std::string& name) {
  for (const auto& pattern : o.freeze) {
    if (name.find(pattern) != std::string::npos) return pattern;
  }
  return "";
}

constexpr const char* kFix = "resume with the saved run's --freeze, or continue its weights in a new "
                             "run (--save-full FILE at the saved --freeze, then --init-from FILE)";

}  // namespace

void check_same_freeze(const nlohmann::json& meta, const std::string& path, const TrainOptions& o) {
  if (!o.muon || !meta.contains("params") || !meta["params"].is_array()) return;
  for (const auto& param : meta["params"]) {
    // Saved by several optimizers: each parameter names the one that held it, null for none.
    if (!param.is_object() || !param.contains("optimizer") || !param["name"].is_string()) continue;
    const std::string name = param["name"].get<std::string>().substr(0, 200);
    const nlohmann::json& held = param["optimizer"];
    const std::string pattern = freezing_pattern(o, name);
    TORCH_CHECK(!held.is_string() || pattern.empty(), "--resume ", path, ": parameter '", name,
                "' trained in the saved run (", held.get<std::string>().substr(0, 20), " held it) but --freeze '",
                pattern, "' freezes it now (--optimizer muon gives its optimizers only what trains): ", kFix);
    TORCH_CHECK(!held.is_null() || !pattern.empty(), "--resume ", path, ": parameter '", name,
                "' was frozen in the saved run (no optimizer held it) but trains now (no --freeze "
                "matches it; --optimizer muon gives its optimizers only what trains): ", kFix);
  }
}

}  // namespace gpt
