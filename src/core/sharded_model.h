#pragma once
// What a ShardedModel handle holds ([Note: one handle behind the face]): the engine's state of the
// model and its root module. Only core's own files include this header; the layers above reach
// the model through core/sharded_view.h.

#include <fsdp/sharded_model.h>

#include <memory>

namespace fsdp {

class FsdpState;

struct ShardedModel::Impl {
  std::shared_ptr<FsdpState> engine;
  std::shared_ptr<torch::nn::Module> module;
};

/// The engine state behind `model`.
inline FsdpState& engine_of(const ShardedModel& model) { return *model.impl().engine; }

}  // namespace fsdp
