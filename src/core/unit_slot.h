#pragma once
// Where a Unit holder (a template in <fsdp/fully_shard.h>) finds its runtime once fully_shard has
// run. Opaque to the face: <fsdp/unit_runtime.h> only names it, and the functions it declares
// (fully_shard.cpp) read it.

#include <fsdp/sharded_model.h>

#include <memory>
#include <optional>

namespace fsdp {

class FsdpState;
class ParamGroup;

namespace detail {

struct UnitSlot {
  std::shared_ptr<ParamGroup> unit;
  FsdpState* model = nullptr;          // the engine the unit belongs to
  std::optional<ShardedModel> sharded_model;  // the root's only: the model, owned (with every unit)
};

}  // namespace detail
}  // namespace fsdp
