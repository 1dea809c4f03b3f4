// What a gpt_train checkpoint's metadata.json says of its run, read with checks
// (saved_metadata.h).
#include "saved_metadata.h"

#include "model_settings.h"
#include "saved_freeze.h"
#include "trainer.h"

#include <fsdp/bounded_json.h>
#include <fsdp/checkpoint.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <limits>
#include <regex>
#include <string>
#include <vector>

namespace gpt {

std::string shown_json(const nlohmann::json& value) {
  const std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);
  return text.size() <= 40 ? text : text.substr(0, 37) + "...";
}

namespace {

// extra.FIELD, an integer in [lo, hi]; throws naming the file and the field.
nlohmann::json saved_integer(const nlohmann::json& extra, const char* field, int64_t lo,
                             uint64_t hi, const std::string& metadata, const char* what) {
  TORCH_CHECK(extra.is_object() && extra.contains(field), metadata, " has no extra.", field, " (",
              what, "): the file was edited or not written by gpt_train; resume from an intact "
              "checkpoint");
  const nlohmann::json& value = extra[field];
  // A non-negative JSON integer is unsigned: both bounds hold for it too (extra.tp: 0 divided).
  const bool in_range = value.is_number_unsigned()
                            ? value.get<uint64_t>() <= hi && (lo <= 0 || value.get<uint64_t>() >= static_cast<uint64_t>(lo))
                            : value.is_number_integer() && value.get<int64_t>() >= lo;
  TORCH_CHECK(in_range, metadata, ": extra.", field, " is ", shown_json(value), ", not an integer from ",
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

// The name of a saved parameter (metadata.json "params"), for a message.
std::string saved_name(const nlohmann::json& param) {
  const nlohmann::json named = param.contains("name") ? param["name"] : nlohmann::json();
  return named.is_string() && named.get<std::string>().size() <= 200 ? named.get<std::string>()
                                                                       : shown_json(named);
}

// The class of the optimizer that held a saved parameter: its own "optimizer" where several
// optimizers saved (--optimizer muon: "Muon" or "AdamW"; null: none held it), else AdamW, the
// only one of a gpt_train run with one optimizer.
std::string saved_optimizer_of(const nlohmann::json& param) {
  if (!param.contains("optimizer")) return "AdamW";
  return param["optimizer"].is_string() ? param["optimizer"].get<std::string>() : "";
}

// The AdamW state of one saved parameter, against the run's step.
void check_adamw_step(const nlohmann::json& param, int64_t step, bool optimizer_stepped,
                      const std::string& metadata, const TrainOptions& o) {
  const std::string name = saved_name(param);
  const nlohmann::json adamw =
      param.contains("optimizer_step") ? param["optimizer_step"] : nlohmann::json();
  if (adamw.is_null()) {
    TORCH_CHECK(!optimizer_stepped || is_frozen(o, name), metadata, ": parameter '", name, "' trains but has no AdamW "
                "state (optimizer_step null): it was frozen in the saved run (resume with its --freeze), or the "
                "checkpoint was saved without it or edited, and AdamW would restart silently; pass "
                "--reset-optimizer to restart AdamW from these parameters on purpose, or resume from a "
                "complete checkpoint");
    return;
  }
  TORCH_CHECK(adamw.is_number_integer() && adamw.get<int64_t>() >= 1 &&
                  adamw.get<int64_t>() <= step,
              metadata, ": parameter '", name, "' has AdamW step ", shown_json(adamw),
              " (optimizer_step), which a run at extra.step ", step, " cannot have (1 to ", step,
              "): the file was edited; resume from an intact checkpoint or pass --reset-optimizer");
}

// Muon's state of one saved parameter: its momentum. Muon counts no steps (torch.optim.Muon
// neither): there is no step to check against the run's.
void check_muon_state(const nlohmann::json& param, bool optimizer_stepped,
                      const std::string& metadata, const TrainOptions& o) {
  const std::string name = saved_name(param);
  const nlohmann::json moments =
      param.contains("optimizer_moments") ? param["optimizer_moments"] : nlohmann::json();
  const bool has_momentum = moments.is_array() && std::find(moments.begin(), moments.end(),
                                                            "momentum_buffer") != moments.end();
  TORCH_CHECK(has_momentum || !optimizer_stepped || is_frozen(o, name), metadata, ": parameter '",
              name, "' trains but has no Muon state (no momentum_buffer in optimizer_moments): "
              "the checkpoint was saved without it or edited, and Muon's momentum would restart "
              "silently; pass --reset-optimizer to restart both optimizers from these parameters "
              "on purpose, or resume from a complete checkpoint");
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

int saved_tp(const nlohmann::json& meta, const std::string& metadata) {
  const nlohmann::json extra = meta.value("extra", nlohmann::json());
  if (!extra.is_object() || !extra.contains("tp")) return 1;  // saved before --tp
  const nlohmann::json world = meta.value("world_size", nlohmann::json());
  const int64_t ranks = world.is_number_integer() && world.get<int64_t>() > 0 ? world.get<int64_t>() : 1;
  const int64_t tp = saved_integer(extra, "tp", 1, static_cast<uint64_t>(ranks), metadata,
                                   "the saved run's --tp").get<int64_t>();
  // The checkpoint's own record of its layout (fsdp::save_sharded's) must agree.
  const nlohmann::json tp_size = meta.value("tp_size", nlohmann::json(1));
  TORCH_CHECK(ranks % tp == 0 && tp_size == nlohmann::json(tp), metadata, ": extra.tp is ", tp,
              " but the checkpoint was saved by ", ranks, " ranks at tensor-parallel size ", shown_json(tp_size),
              ": the file was edited; resume from an intact checkpoint");
  return static_cast<int>(tp);
}

void check_saved_state(const nlohmann::json& meta, const std::string& folder, const TrainOptions& o) {
  const std::string metadata = folder + "/metadata.json";
  const nlohmann::json extra = meta.value("extra", nlohmann::json());
  const int64_t step = saved_step(extra, metadata);
  saved_seed(extra, metadata);
  saved_tp(meta, metadata);
  const int64_t named = folder_step(folder);
  TORCH_CHECK(named < 0 || named == step, metadata, ": extra.step is ", step, " but its folder is ",
              std::filesystem::path(folder).filename().string(), ": the file was edited or "
              "moved; resume from an intact checkpoint");
  if (o.reset_optimizer || !meta.contains("params") || !meta["params"].is_array()) return;
  // Saved before the optimizers took any step (fp16's scaler skipped them all): no state to restore.
  // Checkpoints of earlier versions do not say, and are taken to have stepped.
  const nlohmann::json stepped = extra.is_object() ? extra.value("optimizer_stepped", nlohmann::json(true))
                                                   : nlohmann::json(true);
  const bool optimizer_stepped = !stepped.is_boolean() || stepped.get<bool>();
  for (const auto& param : meta["params"]) {
    if (!param.is_object()) continue;
    if (saved_optimizer_of(param) == "Muon") {
      check_muon_state(param, optimizer_stepped, metadata, o);
    } else {
      check_adamw_step(param, step, optimizer_stepped, metadata, o);
    }
  }
}

}  // namespace gpt
