#pragma once
/// The planner: what a run will cost before it starts. From a model's parameters by unit (no
/// tensor allocated), the activations a unit keeps per sequence, the world, the device, the links
/// and the sharding policy, it predicts each rank's peak memory broken down, the bytes each kind
/// of collective sends per step (and on which class of link), and the step time; and it searches
/// the configurations for the fastest that fits a memory cap. docs/planner.md has the model.
///
/// Example:
///   fsdp::PlanModel model = my_description();            // units, activations, FLOPs
///   fsdp::PlanSetup setup{model, {/*world=*/8, /*ranks_per_host=*/8}, device, links, policy};
///   fsdp::Plan plan = fsdp::plan(setup);
///   std::cout << fsdp::plan_text(plan);

#include <fsdp/options.h>

#include <nlohmann/json.hpp>

#include <c10/core/ScalarType.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fsdp {

/// One parameter as the planner sees it: a name, a shape, a dtype, and its kind (the engine
/// flattens a unit's parameters by kind: [Note: a unit's flat parameters]); nothing allocated.
struct PlanParam {
  std::string name;
  std::vector<int64_t> shape;
  c10::ScalarType dtype = c10::kFloat;
  bool requires_grad = true;    ///< false: frozen (no gradient, no reduction, no optimizer state)
  bool full_precision = false;  ///< kept in its own dtype under mixed precision (BatchNorm)
  /// In a description for --tp T (PlanModel::tp_size): the dimension tensor parallelism splits
  /// (`shape` is then one rank's part, the whole T parts along it); -1: replicated.
  int64_t tp_dim = -1;
  int64_t numel() const;
};

/// The activation memory of a piece of the model for ONE sequence, in bytes, at the compute dtype
/// the description was made for (what autograd saves depends on it).
struct PlanActivations {
  int64_t saved = 0;         ///< kept from its forward to its backward (no checkpointing)
  int64_t checkpointed = 0;  ///< kept instead under activation checkpointing (its output)
  int64_t forward_transient = 0;   ///< more, only while its forward runs
  int64_t backward_transient = 0;  ///< more, only while its backward runs (gradients, temporaries)
};

/// One collective of tensor parallelism that a unit issues on each TP rank ([Note: tensor
/// parallelism in the plan], src/plan/plan_tensor_parallel.h): what one rank sends (ring
/// formulas: an all-gather or reduce-scatter of a [b, s, C] activation (T-1)/T·b·s·C·e, an
/// all-reduce of n elements 2(T-1)/T·n·bytes), per sequence of the micro-batch (activations) or
/// once per micro-batch (the gradients of parameters replicated over TP: norms).
struct PlanTpCollective {
  enum Kind { AllGather, ReduceScatter, AllReduce } kind = AllGather;
  std::string what;           ///< e.g. "attention's input, gathered along the sequence"
  bool backward = false;      ///< issued by backward (else forward: again when checkpointing recomputes it)
  bool per_sequence = true;   ///< `bytes` are per sequence of the micro-batch (else per micro-batch)
  int64_t bytes = 0;          ///< one rank sends
  /// The replicated parameter whose gradient it sums (a norm's weight), if any: none when that
  /// parameter is frozen (requires_grad false).
  std::string parameter;
};

/// One FSDP unit: its parameters, its activations and its work, per sequence.
struct PlanUnit {
  std::string name;
  std::vector<PlanParam> params;
  PlanActivations activations;
  // The work of one sequence's forward, by kind of kernel (its backward is taken as twice it).
  double forward_flops = 0;            ///< matrix products
  double forward_attention_flops = 0;  ///< fused attention's products (QKᵀ and PV)
  double forward_transcendentals = 0;  ///< elements through tanh/exp/erf outside attention (GELU)
  double forward_memory_bytes = 0;     ///< memory traffic of the other elementwise ops
  int64_t forward_ops = 0;             ///< kernels of one forward (launch overhead)
  int64_t backward_workspace = 0;   ///< bytes its backward holds whatever the batch (weight gradients)
  /// Its tensor-parallel collectives on one TP rank, in issue order (none at tp_size 1).
  std::vector<PlanTpCollective> tp_collectives;
};

/// A model as the planner sees it. The root unit's forward brackets every other unit's (a
/// transformer's embeddings before the blocks, its head and loss after them): `root_pre` is kept
/// until the end of backward, `root_post` is the head, freed once its backward has run.
struct PlanModel {
  std::string name;
  PlanUnit root;                   ///< its params, root_post's work
  PlanActivations root_pre;        ///< e.g. the embeddings' output, the blocks' first input
  std::vector<PlanUnit> units;     ///< the other units, in forward order
  int64_t sequence_tokens = 0;     ///< tokens of one sequence (for tokens/s)
  int64_t input_bytes_per_sequence = 0;  ///< the batch's inputs and targets
  int64_t resident_bytes = 0;      ///< the program's own tensors (e.g. its training data)
  int64_t step_all_reduce_bytes = 0;  ///< the program's own all-reduce per step (e.g. the loss)
  c10::ScalarType compute_dtype = c10::kFloat;  ///< the dtype the activations were counted in
  /// The tensor-parallel size T the description is for: with T > 1 it is ONE TP rank's share
  /// (its parameters' local shapes, its activations, work and TP collectives).
  int tp_size = 1;

  int64_t numel() const;  ///< Ψ: every parameter element (of one TP rank at tp_size > 1)
};

/// The ranks and how they sit on hosts.
struct PlanWorld {
  int world_size = 1;
  int ranks_per_host = 1;  ///< ranks that share a host (and its fast links)
};

/// How fast a device runs each kind of kernel in one dtype, forward and backward together
/// (achieved rates, not datasheet peaks).
struct KernelRates {
  double matmul_flops = 0;          ///< FLOP/s of a Linear's three products
  double attention_flops = 0;       ///< FLOP/s of fused attention, forward and backward
  double transcendentals = 0;       ///< elements/s through tanh-GELU, forward and backward
  double memory_bandwidth = 0;      ///< bytes/s of elementwise work
};

/// One rank's device: its memory and its speed (measured by probe_device(), or given).
struct PlanDevice {
  std::string name = "device";
  double memory_bytes = 0;    ///< usable per rank (0: unknown, nothing is flagged)
  KernelRates fp32;           ///< computing in fp32
  KernelRates low_precision;  ///< computing in bf16/fp16
  double op_overhead_s = 0;   ///< seconds per kernel beyond its arithmetic (launch, dispatch, autograd)
  /// Bytes/s of the host memory one rank's share of the CPU streams: what an offloaded
  /// optimizer steps at (0: offload is not planned for time).
  double host_memory_bandwidth = 0;
  /// Bytes/s between host memory and the device (PCIe): offload's copies (0: not planned).
  double host_link_bandwidth = 0;
  /// Host memory per rank, for what offload keeps there (0: unknown, offload is not searched).
  double host_memory_bytes = 0;
  /// The share of memory its allocator may hold beyond the bytes allocated: a caching allocator's
  /// split and per-stream cached blocks. A plan that fits with less headroom is flagged at risk.
  double allocator_reserve = 0.10;
};

/// Per-rank bandwidth of each class of link (bytes/s), and the latency of one collective step.
struct PlanLinks {
  double intra_host_bandwidth = 0;
  double cross_host_bandwidth = 0;
  double latency_s = 0;
};

/// The optimizer a run steps, as the planner counts it: its state per parameter element and what
/// its step reads and writes. `name` is torch::optim's class: "SGD", "Adam", "AdamW", "RMSprop" or
/// "Adagrad" (fsdp::optim's fused AdamW and SGD keep the state of torch::optim's); the options are
/// those that add state, and only for the optimizers that have them. Anything else is an error.
/// "Muon" plans fsdp::optim::Muon for the hidden matrices and AdamW for the rest (Keller Jordan's
/// split, fsdp::optim::split_for_muon): the momentum, the owners' whole matrices and iteration,
/// and the exchange of updates ([Note: Muon in the plan], src/plan/plan_muon.h).
struct PlanOptimizer {
  std::string name = "AdamW";
  bool amsgrad = false;   ///< Adam, AdamW: max_exp_avg_sq
  bool momentum = false;  ///< SGD, RMSprop (momentum != 0): momentum_buffer
  bool centered = false;  ///< RMSprop: grad_avg
  int64_t ns_steps = 5;   ///< Muon: Newton-Schulz iterations per matrix per step (MuonOptions::ns_steps)
};

/// What the run does: FullyShardOptions (strategy, shard group, mixed precision, offload,
/// prefetch, rate limit, activation checkpointing), the optimizer and the sequences per rank per
/// step.
struct PlanPolicy {
  FullyShardOptions fsdp;
  /// Tensor parallelism: T consecutive ranks (inside a host) split each layer, FSDP shards over
  /// the W/T data-parallel ranks of each TP index (the mesh dp_replicate x dp_shard x tp); the
  /// shard group size and the batch are the data-parallel world's. The model must be described
  /// for it (PlanModel::tp_size).
  int tp_size = 1;
  PlanOptimizer optimizer;
  int64_t batch = 1;
  /// The optimizer's zero_grad zeroes gradients in place (set_to_none = false, PyTorch 1.x's
  /// default) instead of freeing them (LibTorch's default): the gradient shards then stay from one
  /// step to the next, and a step starts with them.
  bool gradients_kept = false;
  /// Gradient accumulation: backwards per optimizer step. From the second on, the gradient shards
  /// of the earlier ones are alive and each reduction adds into them through a temporary.
  int64_t micro_batches = 1;
  /// The micro-batches before the last run under NoSyncGuard: each unit's unsharded gradient is
  /// kept (and added to) until the last one reduces it.
  bool no_sync = false;
  /// An asynchronous save planned (fsdp::save_checkpoint_async): its staging arena, kept from the
  /// first save on, is in every later step's memory (host memory: counted in the peak on a
  /// CPU, in RankMemory::staging_bytes on a GPU). -1: none; 0: the default budget, what a
  /// writing rank stages (its pieces of the parameters and their optimizer state); more: that
  /// many bytes (AsyncSaveOptions::staging_budget_bytes).
  int64_t async_save_staging_bytes = -1;
};

struct PlanSetup {
  PlanModel model;
  PlanWorld world;
  PlanDevice device;
  PlanLinks links;
  PlanPolicy policy;
};

/// A rank's memory at its peak, by what holds it (bytes).
struct MemoryBreakdown {
  int64_t sharded_params = 0;     ///< this rank's shards (padding included)
  int64_t sharded_grads = 0;      ///< its gradient shards
  int64_t optimizer_state = 0;    ///< the optimizer's state tensors of its pieces (AdamW: two moments)
  int64_t unsharded_params = 0;   ///< units all-gathered at that moment (rate limiter, prefetch)
  int64_t unsharded_grads = 0;    ///< unsharded gradients accumulating or awaiting reduction
  int64_t activations = 0;        ///< kept for backward
  int64_t workspace = 0;          ///< transients of the op running then, reduction outputs
  int64_t program = 0;            ///< the program's own tensors and the batch
  int64_t staging = 0;            ///< an asynchronous save's staging arena (PlanPolicy), on a CPU
  int64_t total() const;
};

struct RankMemory {
  int rank = 0;
  MemoryBreakdown peak;       ///< at the moment of the peak
  std::string peak_at;        ///< when it happens, e.g. "backward of h.3"
  int64_t model_states = 0;   ///< parameters, gradients and optimizer state (ZeRO's 16Ψ/W)
  int64_t offloaded_bytes = 0;  ///< in host memory with CPU offload (not in peak)
  int64_t staging_bytes = 0;    ///< an asynchronous save's staging arena (in peak on a CPU)
};

/// Bytes a rank sends per step, by collective (the counters of fsdp::comm_stats()) and by class
/// of link (averaged over the ranks: only the ranks at a host's edge send across hosts).
struct PlanTraffic {
  int64_t all_gather = 0;
  int64_t reduce_scatter = 0;
  int64_t all_reduce = 0;
  int64_t all_to_all = 0;  ///< Muon's exchange of updates with the matrices' owners
  int64_t intra_host = 0;
  int64_t cross_host = 0;
  int64_t collectives = 0;  ///< calls per step
  // Tensor parallelism's own (comm_stats' tp_*_bytes), apart from FSDP's above; in intra_host
  // (cross_host when a TP group spans hosts) and collectives too.
  int64_t tp_all_gather = 0;
  int64_t tp_reduce_scatter = 0;
  int64_t tp_all_reduce = 0;
};

/// The predicted step time, in seconds.
struct PlanTime {
  double compute = 0;        ///< matrix products, other ops, the optimizer
  double communication = 0;  ///< every collective, back to back
  double exposed_communication = 0;  ///< the part prefetch cannot hide behind compute
  double tensor_parallel = 0;  ///< TP's collectives (in both above: compute waits for each)
  double step = 0;           ///< compute + exposed communication
  double tokens_per_s = 0;   ///< over the world
};

/// What Muon adds to a plan with optimizer "Muon" ([Note: Muon in the plan]); zeros otherwise.
/// Each is also inside the plan's totals: the momentum in optimizer_state, the workspace in the
/// peak at the optimizer step, the exchange in traffic.all_to_all, the iteration in time.compute.
struct PlanMuon {
  int64_t matrices = 0;          ///< stepped by Muon: the blocks' trainable 2-D parameters
  int64_t matrix_elements = 0;   ///< N_muon: their elements (the rest is AdamW's)
  int64_t momentum_bytes = 0;    ///< rank 0's pieces of their momentum_buffer
  /// The exchange's and the iteration's transient at the optimizer step (the pieces, the whole
  /// matrices a rank owns, their results, the iteration's tensors): the largest over the ranks.
  int64_t workspace = 0;
  int workspace_rank = 0;
  std::string workspace_at;      ///< when, e.g. "the second all-to-all"
  /// Newton-Schulz flops per step of the ranks of a shard group (under TP, of its tp groups: a
  /// replicated matrix is orthogonalized on each tp rank)
  double total_flops = 0;
  double busiest_flops = 0;      ///< the busiest rank's share (owners balanced over the shard group)
  double newton_schulz_s = 0;    ///< the busiest rank's share at the device's bf16 matmul rate
  /// What each world rank sends per step: its pieces to owners, its results back (under TP also
  /// its parts to the whole's owner, the whole's parts back). Owners' shares are uneven.
  std::vector<int64_t> all_to_all_by_rank;
  int64_t all_to_all_busiest = 0;  ///< the most a rank sends
  int all_to_all_busiest_rank = 0;
  double all_to_all_mean = 0;      ///< over the ranks (traffic.all_to_all: rounded)
  double all_to_all_s = 0;  ///< the busiest rank's exchange (all-to-alls, the check's all-reduce), not hidden
};

struct Plan {
  PlanSetup setup;
  int shard_group_size = 1;
  int replicas = 1;
  std::vector<RankMemory> ranks;   ///< one per distinct rank layout (every rank with W <= 8)
  int64_t peak_bytes = 0;          ///< the largest over the ranks
  PlanTraffic traffic;             ///< of rank 0
  PlanTime time;
  PlanMuon muon;                   ///< with optimizer "Muon"
  double headroom = 0;             ///< 1 - peak / device memory (0 if the memory is unknown)
  bool fits = true;                ///< peak <= device memory, and what is offloaded <= host memory
  bool host_fits = true;           ///< what is offloaded <= host memory (when known)
  bool at_risk = false;            ///< fits, with less headroom than device.allocator_reserve
  bool tp_spans_hosts = false;     ///< a TP group is wider than a host: its collectives cross hosts
  std::string label() const;       ///< e.g. "full F=8 bf16 AC batch 2", "full F=32 TP=8 bf16 batch 1"
};

/// A model description as JSON, and back (fsdp_plan --model-json): every field of PlanModel by its
/// name, dtypes as "fp32" / "bf16" / "fp16", activations and work per sequence. Throws naming the
/// missing or malformed key.
nlohmann::json plan_model_json(const PlanModel& model);
PlanModel plan_model_from_json(const nlohmann::json& json);

/// Predicts the run; throws naming the bad input (e.g. a shard group that does not divide W).
Plan plan(const PlanSetup& setup);

/// The configurations a search tries: sharding strategies, activation checkpointing, offload
/// (only with a GPU and the host memory for it) and batches per rank.
struct SearchSpace {
  std::vector<ShardingStrategy> strategies = {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                                              ShardingStrategy::HybridShard, ShardingStrategy::NoShard};
  std::vector<bool> activation_checkpointing = {false, true};
  std::vector<bool> cpu_offload = {false};
  std::vector<int64_t> batches;  ///< empty: the setup's batch only
  /// Tensor-parallel sizes (empty: the setup's only), each planned with model_for_tp(T), the
  /// model described for it (required with any T other than the setup's).
  std::vector<int> tp_sizes;
  std::function<PlanModel(int)> model_for_tp;
  /// A batch below the setup's is made up by gradient accumulation (the setup's batch a
  /// multiple of it): the step's sequences stay, its micro-batches multiply (gpt_train --auto).
  bool keep_global_batch = false;
  /// A plan is accepted only if its peak <= (1 - peak_margin) x the cap: the planner's accuracy.
  double peak_margin = 0;
};

/// The planner's accuracy on peaks as --auto keeps it: a plan is accepted at peak <= 0.92 x cap,
/// so a run may exceed its plan by 1/0.92 = 1.087x. The grid's measured worst case is 1.049x
/// (tests/plan_grid_test.cpp, docs/planner.md "Accuracy"); that test fails above 1.087x.
constexpr double kPlanPeakMargin = 0.08;

struct SearchResult {
  std::vector<Plan> fitting;   ///< fastest first (tokens/s over the world)
  std::vector<std::string> slower_because;  ///< per fitting plan: why it loses to the first
  std::vector<std::pair<Plan, std::string>> rejected;  ///< each with why it loses
  const Plan* best() const { return fitting.empty() ? nullptr : &fitting.front(); }
};

/// Every configuration of `space` around `setup`, each planned; those whose peak fits under
/// `max_memory_bytes` per rank sorted fastest first, the others with the reason.
SearchResult search_plans(const PlanSetup& setup, const SearchSpace& space, double max_memory_bytes);

/// A human-readable report, and the same as JSON (--json).
std::string plan_text(const Plan& plan);
nlohmann::json plan_json(const Plan& plan);
std::string search_text(const SearchResult& result, double max_memory_bytes);
nlohmann::json search_json(const SearchResult& result, double max_memory_bytes);

/// Measures the activations of a unit for which no count exists: runs `forward` on `input` (ONE
/// sequence, on the unit's device, in its compute dtype) and backward from its output, counting
/// bytes (fsdp::memory_stats: call install_memory_counter() first on a CPU). `saved`: what the
/// forward left allocated (its output included); `checkpointed`: the output; the transients: the
/// peaks above those. Backward's transient includes the unit's parameter gradients (their share
/// does not grow with the batch, so at larger batches it is an overestimate).
PlanActivations measure_activations(const std::function<at::Tensor(const at::Tensor&)>& forward,
                                    const at::Tensor& input);

/// The shapes a probe measures at: a model's own (rates depend on shapes, on a CPU strongly).
struct ProbeShape {
  int64_t tokens = 1024;   ///< rows of a Linear: sequences x tokens per sequence
  int64_t width = 512;     ///< its input features (its output: 4x, an MLP's first layer)
  int64_t sequences = 8;   ///< attention: batch
  int64_t sequence = 128;  ///< attention: tokens per sequence (causal)
  int64_t heads = 8;
};

/// Measures this process's device for a few seconds, in fp32 and bf16, forward and backward: a
/// Linear's products, causal fused attention, tanh-GELU, an elementwise add; and what one op costs
/// beyond its arithmetic (a tiny Linear's forward and backward). On a GPU also what offload moves
/// through: the host memory's bandwidth (the whole host's) and a pinned copy up.
/// `memory_bytes` is left to the caller (a CPU's is the host's, shared by its ranks).
PlanDevice probe_device(const c10::Device& device, const ProbeShape& shape);

}  // namespace fsdp
