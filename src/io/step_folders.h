#pragma once
// The step folders of a checkpoint directory (src/io/checkpoint_dir.cpp), as save_checkpoint and
// save_checkpoint_async use them: the folder of a step, checked before a save, published after.

#include "io/checkpoint_agreement.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace fsdp::detail {

/// `extra` (a JSON object) with "step": `step` added; throws for another extra.step.
nlohmann::json extra_with_step(const nlohmann::json& extra, int64_t step);

/// The name of `step`'s folder in `dir` ("step-00000020"), once every rank agreed that it is not
/// the published one (a collective; throws on every rank otherwise).
std::string unpublished_step_folder(const AgreementGroups& world, const std::string& dir, int64_t step);

/// Points `dir`/latest at the complete folder `name`, then prunes to `keep_last` (a collective).
void publish_step_folder(const AgreementGroups& world, const std::string& dir, const std::string& name,
                         int keep_last);

}  // namespace fsdp::detail
