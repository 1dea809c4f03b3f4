#pragma once
// --optimizer muon builds its param groups from the parameters that train (split_for_muon skips a
// frozen one), so a checkpoint's groups fit only the same --freeze: a resume whose --freeze
// differs is refused naming the parameter and the flag, before the library's param-group check.

#include "options.h"

#include <nlohmann/json.hpp>

#include <string>

namespace gpt {

/// Throws naming the first parameter of `meta` (a checkpoint's metadata.json, at `path`) that an
/// optimizer held in the saved run and --freeze freezes now, or the other way round.
void check_same_freeze(const nlohmann::json& meta, const std::string& path, const TrainOptions& o);

}  // namespace gpt
