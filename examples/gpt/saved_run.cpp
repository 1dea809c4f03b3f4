#include "saved_run.h"

#include "model_setup.h"

#include <c10/util/Exception.h>

#include <filesystem>
#include <limits>
#include <regex>

namespace gpt {

namespace {

// A JSON value for a message: at most 40 characters of it (a user's file may hold anything).
std::string shown(const nlohmann::json& value) {
  const std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);
  return text.size() <= 40 ? text : text.substr(0, 37) + "...";
}

// extra.FIELD, an integer in [lo, hi]; throws naming the file and the field.
nlohmann::json saved_integer(const nlohmann::json& extra, const char* field, int64_t lo,
                             uint64_t hi, const std::string& metadata, const char* what) {
  TORCH_CHECK(extra.is_object() && extra.contains(field), metadata, " has no extra.", field, " (",
              what, "): the file was edited or not written by gpt_train; resume from an intact "
              "checkpoint");
  const nlohmann::json& value = extra[field];
  const bool in_range = value.is_number_unsigned() ? value.get<uint64_t>() <= hi
                        : value.is_number_integer() && value.get<int64_t>() >= lo;
  TORCH_CHECK(in_range, metadata, ": extra.", field, " is ", shown(value), ", not an integer from ",
              lo, " to ", hi, " (", what, "): the file was edited; resume from an intact "
              "checkpoint");
  return value;
}

// The step of a folder named step-NNNNNNNN; -1 for any other name.
int64_t folder_step(const std::string& folder) {
  static const std::regex step_re("step-([0-9]{8})");
  std::smatch m;
  const std::string name = std::filesystem::path(folder).filename().string();
  return std::regex_match(name, m, step_re) ? std::stoll(m[1]) : -1;
}

// The AdamW state of one saved parameter (metadata.json "params"), against the run's step.
void check_adamw_step(const nlohmann::json& param, int64_t step, bool optimizer_stepped,
                      const std::string& metadata, const TrainOptions& o) {
  const nlohmann::json named = param.contains("name") ? param["name"] : nlohmann::json();
  const std::string name =
      named.is_string() && named.get<std::string>().size() <= 200 ? named.get<std::string>() : shown(named);
  const nlohmann::json adamw =
      param.contains("optimizer_step") ? param["optimizer_step"] : nlohmann::json();
  if (adamw.is_null()) {
    TORCH_CHECK(!optimizer_stepped || is_frozen(o, name), metadata, ": parameter '", name, "' trains but has no AdamW "
                "state (optimizer_step null): the checkpoint was saved without it or edited, and "
                "AdamW would restart silently; pass --reset-optimizer to restart AdamW from these "
                "parameters on purpose, or resume from a complete checkpoint");
    return;
  }
  TORCH_CHECK(adamw.is_number_integer() && adamw.get<int64_t>() >= 1 &&
                  adamw.get<int64_t>() <= step,
              metadata, ": parameter '", name, "' has AdamW step ", shown(adamw),
              " (optimizer_step), which a run at extra.step ", step, " cannot have (1 to ", step,
              "): the file was edited; resume from an intact checkpoint or pass --reset-optimizer");
}

}  // namespace

int64_t saved_step(const nlohmann::json& extra, const std::string& metadata) {
  return saved_integer(extra, "step", 0, std::numeric_limits<int64_t>::max(), metadata,
                       "the step to continue from")
      .get<int64_t>();
}

uint64_t saved_seed(const nlohmann::json& extra, const std::string& metadata) {
  return saved_integer(extra, "seed", 0, std::numeric_limits<int64_t>::max(), metadata,
                       "the run's --seed")
      .get<uint64_t>();
}

void check_saved_state(const nlohmann::json& meta, const std::string& folder, const TrainOptions& o) {
  const std::string metadata = folder + "/metadata.json";
  const nlohmann::json extra = meta.value("extra", nlohmann::json());
  const int64_t step = saved_step(extra, metadata);
  saved_seed(extra, metadata);
  const int64_t named = folder_step(folder);
  TORCH_CHECK(named < 0 || named == step, metadata, ": extra.step is ", step, " but its folder is ",
              std::filesystem::path(folder).filename().string(), ": the file was edited or "
              "moved; resume from an intact checkpoint");
  if (o.reset_optimizer || !meta.contains("params") || !meta["params"].is_array()) return;
  // Saved before AdamW took any step (fp16's scaler skipped them all): no state to restore.
  // Checkpoints of earlier versions do not say, and are taken to have stepped.
  const nlohmann::json stepped = extra.is_object() ? extra.value("optimizer_stepped", nlohmann::json(true))
                                                   : nlohmann::json(true);
  const bool optimizer_stepped = !stepped.is_boolean() || stepped.get<bool>();
  for (const auto& param : meta["params"]) {
    if (param.is_object()) check_adamw_step(param, step, optimizer_stepped, metadata, o);
  }
}

}  // namespace gpt
