#pragma once
// gpt_train's model before the first step: checked --freeze patterns, the GPT built (sharded
// unless this is the reference; --deferred-init: block by block) and its initial weights
// (--init-from, --init-from-hf).

#include "gpt.h"
#include "train_options.h"

#include <fsdp/distributed.h>
#include <fsdp/fully_shard.h>

namespace gpt {

/// Every --freeze pattern must match a parameter name (with --deferred-init, names relative to a
/// block): a typo would otherwise train the whole model silently. Throws naming the pattern.
void check_freeze_patterns(const TrainOptions& o);

/// Whether --freeze keeps the parameter `name` (a full name, or one relative to a block) frozen.
bool is_frozen(const TrainOptions& o, const std::string& name);

/// The GPT of `o` with its --freeze parameters frozen, sharded over `dist` (moved to
/// fsdp.device()), or unsharded on the compute device when `dist` is null. Deferred: built and
/// sharded block by block, each block initialised (and frozen) by its own parameter names just
/// before it is sharded.
fsdp::Unit<GPT> build_model(const TrainOptions& o, fsdp::Distributed* dist);

/// Loads --init-from or --init-from-hf into the model (each rank its shard); no-op without them.
void load_initial_weights(const TrainOptions& o, fsdp::Unit<GPT>& model);

}  // namespace gpt
