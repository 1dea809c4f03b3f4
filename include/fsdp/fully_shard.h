#pragma once
/// fully_shard(): shard a LibTorch module across the ranks of a process group.
///
/// C++ cannot patch a module's forward the way Python FSDP does, so a unit boundary must sit in
/// the call path: a model holds its blocks as `fsdp::Unit<Block>` and calls them through it. Until
/// the model is sharded a Unit is a plain pass-through, so the same model code trains unsharded.
///
/// Example:
///   struct NetImpl : torch::nn::Module {
///     NetImpl() {
///       fc1 = register_module("fc1", fsdp::Unit<torch::nn::Linear>(784, 256));  // a unit
///       for (int i = 0; i < 4; ++i) {
///         blocks.emplace_back(register_module("h" + std::to_string(i), Block()));
///       }
///       head = register_module("head", torch::nn::Linear(256, 10));
///     }
///     torch::Tensor forward(torch::Tensor x) {
///       x = fc1->forward(x);                       // unshard, forward, reshard
///       for (auto& block : blocks) x = block(x);   // the same
///       return head(x);
///     }
///     fsdp::Unit<torch::nn::Linear> fc1{nullptr};  // declared as the holder it replaces
///     std::vector<fsdp::Unit<Block>> blocks;       // one unit per block
///     torch::nn::Linear head{nullptr};             // belongs to the root unit
///   };
///   TORCH_MODULE(Net);
///
///   auto dist = fsdp::init_distributed();
///   auto model = fsdp::fully_shard(Net(), *dist->world);
///   torch::optim::AdamW optim(model->parameters());  // sees only this rank's shards
///   auto loss = model(x).pow(2).mean();
///   loss.backward();                                  // gradients reduce-scattered per unit
///   optim.step();

#include <fsdp/distributed.h>
#include <fsdp/options.h>
#include <fsdp/sharded_model.h>
#include <fsdp/unit_runtime.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace fsdp {

/// Whether M is a module holder (torch::nn::Linear, a TORCH_MODULE, torch::nn::ModuleHolder<T>).
template <class M>
inline constexpr bool is_module_holder_v = torch::detail::is_module_holder<M>::value;

namespace detail {
/// Whether the arguments build an `Impl` rather than name a module (a holder, a pointer, nullptr).
template <class Impl, class Head, class... Tail>
constexpr bool builds_module() {
  using H = std::decay_t<Head>;
  const bool names_a_module = sizeof...(Tail) == 0 &&
                              (std::is_same_v<H, std::nullptr_t> || is_module_holder_v<H> ||
                               std::is_same_v<H, std::shared_ptr<Impl>>);
  return !names_a_module && std::is_constructible_v<Impl, Head, Tail...>;
}
}  // namespace detail

/// Holds a module (a torch::nn::ModuleHolder such as `torch::nn::Linear` or your TORCH_MODULE)
/// as one FSDP unit. Calling it runs: unshard (all-gather), the module's forward, reshard.
///
/// A Unit is the holder itself, so it is declared, built and registered as the holder it replaces:
///   fsdp::Unit<torch::nn::Linear> fc1{nullptr};                  // was: torch::nn::Linear fc1{nullptr};
///   fc1 = register_module("fc1", fsdp::Unit<torch::nn::Linear>(784, 64));
///   x = fc1->forward(x);                                          // or fc1(x): through the unit
// [Note: a Unit is its module's holder]
// Unit<M> derives from the holder M, so a port changes only a member's type: register_module takes
// a Unit (its ModuleHolder<T> overload deduces T through the base) and returns a shared_ptr that
// converts back into the same unit, because units are found by their module (register_unit), so
// every holder of one module is one unit. The holder's own API stays (ptr(), is_empty(),
// torch::save and torch::load). Only () and -> are the unit's: `*unit` and `unit.get()` are the
// holder's and reach the module itself, skipping the unit.
template <class M>
class Unit : public M {
  static_assert(is_module_holder_v<M>,
                "fsdp::Unit<M>: M must be a module holder such as torch::nn::Linear, or a "
                "TORCH_MODULE: write `struct BlockImpl : torch::nn::Module {...}; "
                "TORCH_MODULE(Block);` and hold fsdp::Unit<Block> (or use "
                "fsdp::Unit<torch::nn::ModuleHolder<BlockImpl>> for a module kept in a shared_ptr)");

 public:
  using Impl = typename M::ContainedType;

  /// An empty unit, as `torch::nn::Linear fc{nullptr}` is an empty holder: assign it later.
  Unit() : M(nullptr) {}
  /* implicit */ Unit(std::nullptr_t) : M(nullptr) {}
  /* implicit */ Unit(M module) : M(std::move(module)) { attach(); }
  /// Also register_module's result: another holder of a module is the same unit.
  /* implicit */ Unit(std::shared_ptr<Impl> module) : M(std::move(module)) { attach(); }
  /// Builds the module from its constructor's arguments, as `torch::nn::Linear(784, 64)` does:
  /// `fsdp::Unit<torch::nn::Linear>(784, 64)`, `fsdp::Unit<Block>(config)`.
  template <class Head, class... Tail,
            class = std::enable_if_t<detail::builds_module<Impl, Head, Tail...>()>>
  explicit Unit(Head&& head, Tail&&... tail) : M(std::forward<Head>(head), std::forward<Tail>(tail)...) {
    attach();
  }

  // Const, as a holder's call is: a const method of the program may call a unit.
  template <class... Args>
  auto operator()(Args&&... args) const {
    return run(Forward{}, std::forward<Args>(args)...);
  }

  /// Calls another method of the module through the unit, as FSDP2's register_fsdp_forward_method:
  /// unshard, `method`, reshard (a generator's `sample`, an LSTM's packed forward).
  ///   auto images = generator.call(&GeneratorImpl::sample, 16);
  template <class Method, class... Args>
  auto call(Method method, Args&&... args) const {
    return run(CallMethod<Method>{method}, std::forward<Args>(args)...);
  }

  M& module() { return *this; }
  const M& module() const { return *this; }
  /// The module's members, `forward` going through the unit ([Note: unit->forward]).
  auto operator->() {
    if constexpr (std::is_final_v<Impl>) {
      return M::operator->();
    } else {
      return static_cast<detail::UnitMembers<Unit>*>(M::operator->());
    }
  }
  auto operator->() const { return M::operator->(); }
  bool is_sharded() const { return detail::is_sharded(slot_.get()); }

  /// The model sharded through this root (fully_shard's result); throws if this is not one.
  ShardedModel& sharded_model() const { return detail::sharded_root_of(slot_.get()); }
  /// The same, or null: this unit is not the root of a sharded model.
  ShardedModel* find_sharded_model() const { return detail::root_of(slot_.get()); }

  /// The units of the model sharded through this root, root first (empty unless this is a root).
  std::vector<UnitInfo> units() const {
    const ShardedModel* model = find_sharded_model();
    return model ? model->units() : std::vector<UnitInfo>{};
  }

  /// Internal: a holder of the unit whose module is `impl` (another holder of the same unit).
  static Unit holding(Impl* impl) {
    Unit unit;
    static_cast<M&>(unit) = M(std::static_pointer_cast<Impl>(impl->shared_from_this()));
    unit.slot_ = detail::find_unit(impl);
    return unit;
  }

 private:
  // What a unit runs between unshard and reshard: the module's forward, or another method.
  struct Forward {
    template <class... Args>
    auto operator()(Impl& module, Args&&... args) const {
      return module.forward(std::forward<Args>(args)...);
    }
  };
  template <class Method>
  struct CallMethod {
    Method method;
    template <class... Args>
    auto operator()(Impl& module, Args&&... args) const {
      return std::invoke(method, module, std::forward<Args>(args)...);
    }
  };

  void attach() {
    if (this->is_empty()) return;
    slot_ = detail::register_unit(this->ptr().get());
    detail::shard_if_deferred(*slot_, this->ptr());
  }

  // Before fully_shard, and inside a SummonFullParams scope, a unit is a plain call.
  template <class Fn, class... Args>
  auto run(Fn fn, Args&&... args) const {
    if (!is_sharded() || detail::holds_full_params(*slot_)) {
      return fn(*this->ptr(), std::forward<Args>(args)...);
    }
    const auto dtype = detail::input_dtype(*slot_);
    return sharded_call(fn, detail::cast_input(dtype, std::forward<Args>(args))...);
  }

  // Unshard, run, reshard; the pre-backward hook goes on the outputs.
  template <class Fn, class... Args>
  auto sharded_call(const Fn& fn, Args&&... args) const {
    std::vector<at::Tensor> inputs, outputs;
    (detail::collect_tensors(args, inputs), ...);
    detail::pre_forward(*slot_);
    auto output = run_maybe_checkpointed(fn, std::forward<Args>(args)...);
    detail::collect_tensors(output, outputs);
    detail::post_forward(*slot_, inputs, outputs, this->ptr()->is_training());
    return output;
  }

  template <class Fn, class... Args>
  auto run_maybe_checkpointed(const Fn& fn, Args&&... args) const {
    using Output = std::decay_t<decltype(fn(*this->ptr(), std::forward<Args>(args)...))>;
    constexpr bool checkpointable = std::is_same_v<Output, at::Tensor> &&
                                    (std::is_convertible_v<Args, const at::Tensor&> && ...);
    if constexpr (checkpointable) {
      if (detail::checkpoints_activations(*slot_)) {
        return detail::run_checkpointed(
            [module = this->ptr(), fn](const std::vector<at::Tensor>& inputs) {
              return run_unpacked(*module, fn, inputs, std::index_sequence_for<Args...>{});
            },
            {at::Tensor(args)...});
      }
    } else {
      TORCH_CHECK(!detail::checkpoints_activations(*slot_), "activation_checkpointing: the forward "
                  "of unit '", detail::unit_name(*slot_), "' must take only tensors and return one "
                  "tensor to be recomputed; turn the option off or change the unit's forward");
    }
    return fn(*this->ptr(), std::forward<Args>(args)...);
  }

  template <class Fn, size_t... I>
  static at::Tensor run_unpacked(Impl& module, const Fn& fn, const std::vector<at::Tensor>& inputs,
                                 std::index_sequence<I...>) {
    return fn(module, inputs[I]...);
  }

  std::shared_ptr<detail::UnitSlot> slot_;
};

template <class M>
ShardedModel::ShardedModel(const Unit<M>& root) : ShardedModel(root.sharded_model()) {}

/// Gradient accumulation without communication: while it lives, backward keeps each unit's
/// unsharded gradient and adds to it instead of reduce-scattering (more memory: every unit's
/// unsharded gradient stays allocated). The first backward after it ends reduces the sum once.
/// Do not step the optimizer inside it.
///
/// Example:
///   {
///     fsdp::NoSyncGuard no_sync(model);
///     (model(x1).loss() / 2).backward();   // no communication
///   }
///   (model(x2).loss() / 2).backward();     // one reduce-scatter of the sum
///   optimizer.step();
class NoSyncGuard {
 public:
  explicit NoSyncGuard(const ShardedModel& model);
  ~NoSyncGuard();
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  ShardedModel model_;
};

/// Shards `model` over `group`: every `fsdp::Unit` inside it becomes one unit, and the parameters
/// outside all units form the root unit. Returns the root, through which forward must be called.
/// Checks (unless disabled in `options`) that every rank built the same model, and throws on every
/// rank naming the first parameter that differs.
template <class M>
Unit<M> fully_shard(M model, ProcessGroup& group, FullyShardOptions options = {}) {
  static_assert(is_module_holder_v<M>,
                "fsdp::fully_shard takes a module holder, not a module by value: declare "
                "`struct NetImpl : torch::nn::Module {...}; TORCH_MODULE(Net);` and pass Net(), "
                "or pass std::make_shared<NetImpl>()");
  Unit<M> root(std::move(model));
  detail::shard_model(root.module().ptr(), group, options);
  return root;
}

/// A model kept in a std::shared_ptr (`auto net = std::make_shared<NetImpl>()`, as many LibTorch
/// programs hold one), sharded as the holder torch::nn::ModuleHolder<NetImpl>.
template <class T, class = std::enable_if_t<std::is_base_of_v<torch::nn::Module, T>>>
Unit<torch::nn::ModuleHolder<T>> fully_shard(std::shared_ptr<T> model, ProcessGroup& group,
                                             FullyShardOptions options = {}) {
  return fully_shard(torch::nn::ModuleHolder<T>(std::move(model)), group, std::move(options));
}

/// Deferred initialisation: builds the model with `factory` and shards every unit the moment
/// its fsdp::Unit holder is constructed, so that no rank ever holds more than the sharded model,
/// the root's own parameters and one unit being built. `init` (optional) initialises each
/// parameter of a unit just before it is sharded (names relative to the unit, e.g.
/// "attn.c_proj.weight"), then the root's. Every rank must run the same factory: each builds
/// every unit whole, with the same random numbers, and keeps its shard (or set
/// sync_module_states to take rank 0's values unit by unit).
///
/// Example:
///   auto model = fsdp::fully_shard_deferred([&] { torch::manual_seed(0); return GPT(config); },
///                                           *dist->world);
///
/// `prepare` (optional) then gets each unit's module, and finally the root, before it is sharded:
/// tensor parallelism splits each block there (examples/gpt/trainer.cpp's --tp --deferred-init).
template <class Factory>
auto fully_shard_deferred(Factory&& factory, ProcessGroup& group, FullyShardOptions options = {},
                          ParamInit init = nullptr, UnitPrepare prepare = nullptr) {
  detail::DeferredScope scope(group, options, std::move(init), std::move(prepare));
  auto model = factory();
  scope.close();
  Unit<decltype(model)> root(std::move(model));
  detail::shard_model(root.module().ptr(), group, options, &scope);
  return root;
}

}  // namespace fsdp
