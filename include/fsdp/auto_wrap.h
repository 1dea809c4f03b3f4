#pragma once
/// Automatic wrapping: make every block of a given type inside a Sequential or a ModuleList a unit.

#include <fsdp/fully_shard.h>

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <vector>

namespace fsdp {

namespace detail {

// Stands in a Sequential's call path for one block; the block itself stays registered under its
// own name, so parameter names do not change.
template <class Holder>
class UnitCallImpl : public torch::nn::Module {
 public:
  explicit UnitCallImpl(Unit<Holder> unit) : unit_(std::move(unit)) {}
  at::Tensor forward(at::Tensor x) { return unit_(std::move(x)); }

 private:
  Unit<Holder> unit_;
};

}  // namespace detail

/// Makes every block of `sequential` whose type is `Holder`'s module (e.g. `Block` for BlockImpl)
/// a unit, for a Sequential whose blocks map one tensor to one tensor. Call before fully_shard.
/// Returns the number of blocks wrapped.
///
/// Example:
///   torch::nn::Sequential net(Block(), Block(), torch::nn::Linear(64, 10));
///   fsdp::wrap_blocks<Block>(net);                      // two units; the Linear joins the root
///   auto model = fsdp::fully_shard(net, *dist->world);
template <class Holder>
int wrap_blocks(torch::nn::Sequential sequential) {  // a holder: shares the module
  using Impl = typename Holder::ContainedType;
  int wrapped = 0;
  for (auto& entry : *sequential) {
    auto block = std::dynamic_pointer_cast<Impl>(entry.ptr());
    if (!block) continue;
    auto call = std::make_shared<detail::UnitCallImpl<Holder>>(Unit<Holder>(Holder(block)));
    entry = torch::nn::AnyModule(call);
    ++wrapped;
  }
  return wrapped;
}

/// The blocks of `list` whose type is `Holder`'s module, each as a unit: call them through the
/// returned holders in your forward. Call before fully_shard.
///
/// Example:
///   blocks = fsdp::wrap_blocks<Block>(h);    // h: a ModuleList registered as "h"
///   for (auto& block : blocks) x = block(x);
template <class Holder>
std::vector<Unit<Holder>> wrap_blocks(const torch::nn::ModuleList& list) {
  using Impl = typename Holder::ContainedType;
  std::vector<Unit<Holder>> units;
  for (const auto& module : *list) {
    if (auto block = std::dynamic_pointer_cast<Impl>(module)) units.emplace_back(Holder(block));
  }
  return units;
}

}  // namespace fsdp
