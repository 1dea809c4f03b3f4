#pragma once
// The settings that change a model's math, as a checkpoint records them: --resume continues a
// run only under the same ones (a Llama under another rope_theta, norm epsilon or head would
// load every tensor and train another function).

#include "gpt.h"

#include <nlohmann/json.hpp>

#include <string>

namespace gpt {

/// Every setting of `config` that the forward depends on, by name (shapes, the family,
/// RoPE and its scaling, the norm's epsilon, a tied head, biases).
nlohmann::json model_settings(const GPTConfig& config);

/// How a message names `setting`: its flag when it has one (--layers), else the config key.
std::string setting_name(const std::string& setting);

}  // namespace gpt
