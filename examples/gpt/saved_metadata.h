#pragma once

#include "options.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace gpt {

// What a gpt_train checkpoint's metadata.json says of its run, read with checks: "extra" (the
// step to continue from, the seed) and each parameter's AdamW step. An edited checkpoint whose
// CRC-32s were recomputed passes every checksum, so what it says must also make sense: a field
// missing, mistyped or out of range, a step that disagrees with its folder's name or with AdamW's,
// a trained parameter without its optimizer's state are refused, naming the file, the field and
// the fix.
/// extra.step of `metadata` (the path of a metadata.json, for the message): an integer >= 0.
int64_t saved_step(const nlohmann::json& extra, const std::string& metadata);

/// extra.seed of `metadata`: an integer that --seed accepts (0 to 2^63 - 1).
uint64_t saved_seed(const nlohmann::json& extra, const std::string& metadata);

/// extra.tp of the parsed metadata.json `meta` (1 when saved before --tp): an integer dividing the
/// saved world size, equal to the checkpoint's own tp_size. Any --tp resumes it (the checkpoint
/// holds boxes of the whole parameters: fsdp/checkpoint.h).
int saved_tp(const nlohmann::json& meta, const std::string& metadata);

/// Before loading the checkpoint `folder` (its parsed metadata.json `meta`): extra.step is the
/// folder's number (step-NNNNNNNN), and every parameter this run trains (not --freeze) has its
/// optimizer's state: AdamW's with a step from 1 to extra.step, Muon's (its "optimizer" in
/// metadata.json, --optimizer muon) its momentum; unless o.reset_optimizer, which asks for the
/// parameters alone. Throws naming metadata.json, the parameter or field, and the fix.
void check_saved_state(const nlohmann::json& meta, const std::string& folder, const TrainOptions& o);

/// A JSON value for a message: at most 40 characters of it (a user's file may hold anything).
std::string shown_json(const nlohmann::json& value);

}  // namespace gpt
