// Each parallel style's described moves (fsdp::tp::moves_of, [Note: a style's two readers]) are
// what its layer issues: one styled layer (or module) of each kind run forward and backward, its
// comm_stats tp_* bytes against the described moves' sent_bytes, forward's and backward's
// apart, kind by kind. The planner
// counts TP's bytes from these descriptions alone. tp = W (dist_world1/2/3).
#include "dist_env.h"
#include "tiny_lm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

namespace fsdp_test::tp_moves {
namespace {

constexpr int64_t kSequences = 2;

// A module whose input a PrepareModuleInput re-lays: two column-wise layers read its one input
// (as q, k and v read an attention's), a row-wise one writes its output.
struct GatedImpl : torch::nn::Module {
  GatedImpl() {
    up = register_module("up", torch::nn::Linear(kDim, kHidden));
    gate = register_module("gate", torch::nn::Linear(kDim, kHidden));
    down = register_module("down", torch::nn::Linear(kHidden, kDim));
  }
  torch::Tensor forward(const torch::Tensor& x) { return down(torch::gelu(gate(x)) * up(x)); }
  fsdp::tp::Parallel<torch::nn::Linear> up{nullptr}, gate{nullptr}, down{nullptr};
};
TORCH_MODULE(Gated);

// One layer of each kind; a case styles and runs some of them.
struct HostImpl : torch::nn::Module {
  HostImpl() {
    col = register_module("col", torch::nn::Linear(kDim, kHidden));
    row = register_module("row", torch::nn::Linear(kHidden, kDim));
    embed = register_module("embed", torch::nn::Embedding(kVocab, kDim));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    gated = register_module("gated", Gated());
  }
  fsdp::tp::Parallel<torch::nn::Linear> col{nullptr}, row{nullptr};
  fsdp::tp::Parallel<torch::nn::Embedding> embed{nullptr};
  fsdp::tp::Parallel<torch::nn::LayerNorm> norm{nullptr};
  fsdp::tp::Parallel<Gated> gated{nullptr};
};
TORCH_MODULE(Host);

struct Case {
  std::string name;
  fsdp::tp::ParallelizePlan plan;
  std::map<std::string, std::pair<int64_t, int64_t>> features;  // path -> its input's, its output's
  std::function<torch::Tensor(Host&, fsdp::tp::TensorParallel&)> run;  // this rank's forward
};

struct Bytes {
  int64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0;
  bool operator==(const Bytes& o) const {
    return all_gather == o.all_gather && reduce_scatter == o.reduce_scatter && all_reduce == o.all_reduce;
  }
};

std::ostream& operator<<(std::ostream& out, const Bytes& b) {
  return out << "{all-gather " << b.all_gather << ", reduce-scatter " << b.reduce_scatter << ", all-reduce "
             << b.all_reduce << "}";
}

// The module at `path` of `host` (before parallelize_module: whole parameters) as moves_of reads it.
fsdp::tp::StyledShape shape_of(Host& host, const Case& c, const std::string& path) {
  fsdp::tp::StyledShape shape;
  const auto module = host->named_modules()[path];
  shape.sequence = kSeq;
  std::tie(shape.in_features, shape.out_features) = c.features.at(path);
  shape.embedding = std::dynamic_pointer_cast<torch::nn::EmbeddingImpl>(module) != nullptr;
  shape.input_prepared = fsdp::tp::input_prepared(c.plan, path);
  for (const auto& item : module->named_parameters()) shape.params.push_back({item.key(), item.value().numel()});
  return shape;
}

// Forward's and backward's bytes, each by kind.
struct Step {
  Bytes forward, backward;
};

int64_t& of_kind(Bytes& b, fsdp::tp::Move::Kind kind) {
  return kind == fsdp::tp::Move::AllGather ? b.all_gather : kind == fsdp::tp::Move::ReduceScatter ? b.reduce_scatter
                                                                                                  : b.all_reduce;
}

Step described(Host& host, const Case& c, int64_t tp) {
  Step out;
  for (const auto& [path, style] : c.plan) {
    for (const fsdp::tp::Move& move : fsdp::tp::moves_of(style, shape_of(host, c, path))) {
      const int64_t bytes = *fsdp::tp::sent_bytes(move, tp, 4) * (move.per_sequence ? kSequences : 1);
      of_kind(move.backward ? out.backward : out.forward, move.kind) += bytes;
    }
  }
  return out;
}

Bytes tp_bytes() {
  const fsdp::CommStats s = fsdp::comm_stats();
  return {s.tp_all_gather_bytes, s.tp_reduce_scatter_bytes, s.tp_all_reduce_bytes};
}

Step issued(Host& host, const Case& c, fsdp::tp::TensorParallel& tp) {
  fsdp::reset_comm_stats();
  const torch::Tensor y = c.run(host, tp);
  Step out;
  out.forward = tp_bytes();
  fsdp::reset_comm_stats();
  y.sum().backward();
  out.backward = tp_bytes();
  return out;
}

// Inputs alike on every rank: [sequences, kSeq, width], whole or this rank's part.
torch::Tensor whole(int64_t width) {
  torch::manual_seed(11);
  return torch::randn({kSequences, kSeq, width}, torch::requires_grad());
}
torch::Tensor part(fsdp::tp::TensorParallel& tp, int64_t width, int64_t dim) {
  torch::manual_seed(11);
  return tp.chunk_along(torch::randn({kSequences, kSeq, width}), dim).requires_grad_();
}

std::vector<Case> cases() {
  using namespace fsdp::tp;
  const auto sharded = RowwiseParallel().output_layout(Layout::ShardSequence);
  return {
      {"column-wise, sequence-sharded input", {{"col", ColwiseParallel().input_layout(Layout::ShardSequence)}},
       {{"col", {kDim, kHidden}}}, [](Host& h, TensorParallel& tp) { return h->col(part(tp, kDim, 1)); }},
      {"column-wise, replicated input and output", {{"col", ColwiseParallel().output_layout(Layout::Replicate)}},
       {{"col", {kDim, kHidden}}}, [](Host& h, TensorParallel&) { return h->col(whole(kDim)); }},
      {"row-wise to the sequence shard (its bias summed)", {{"row", sharded}}, {{"row", {kHidden, kDim}}},
       [](Host& h, TensorParallel& tp) { return h->row(part(tp, kHidden, 2)); }},
      {"row-wise, replicated output", {{"row", RowwiseParallel()}}, {{"row", {kHidden, kDim}}},
       [](Host& h, TensorParallel& tp) { return h->row(part(tp, kHidden, 2)); }},
      {"vocabulary-parallel embedding", {{"embed", sharded}}, {{"embed", {kVocab, kDim}}},
       [](Host& h, TensorParallel&) { return h->embed(batch().first); }},
      {"sequence-parallel norm", {{"norm", SequenceParallel()}}, {{"norm", {kDim, kDim}}},
       [](Host& h, TensorParallel& tp) { return h->norm(part(tp, kDim, 1)); }},
      {"a gathered input shared by two column-wise layers",
       {{"gated", PrepareModuleInput()}, {"gated.up", ColwiseParallel()}, {"gated.gate", ColwiseParallel()},
        {"gated.down", sharded}},
       {{"gated", {kDim, kDim}}, {"gated.up", {kDim, kHidden}}, {"gated.gate", {kDim, kHidden}},
        {"gated.down", {kHidden, kDim}}},
       [](Host& h, TensorParallel& tp) { return h->gated(part(tp, kDim, 1)); }},
      {"a replicated input chunked along the sequence",
       {{"norm", PrepareModuleInput().input_layout(Layout::Replicate).desired_input_layout(Layout::ShardSequence)}},
       {{"norm", {kDim, kDim}}}, [](Host& h, TensorParallel&) { return h->norm(whole(kDim)); }},
  };
}

TEST(TpMoves, EachStyleMovesWhatItDescribes) {
  for (const Case& c : cases()) {
    torch::manual_seed(3);
    Host host;
    auto tp = world_tp();
    const Step want = described(host, c, tp->size());
    fsdp::tp::parallelize_module(*host, tp, c.plan);
    const Step got = issued(host, c, *tp);
    EXPECT_EQ(got.forward, want.forward) << c.name << ": forward at tp " << tp->size();
    EXPECT_EQ(got.backward, want.backward) << c.name << ": backward at tp " << tp->size();
    const Bytes& f = want.forward;
    const Bytes& b = want.backward;
    const int64_t total = f.all_gather + f.reduce_scatter + f.all_reduce + b.all_gather + b.reduce_scatter + b.all_reduce;
    if (tp->size() > 1) {
      EXPECT_GT(total, 0) << c.name << " moves something";
    }
  }
}

}  // namespace
}  // namespace fsdp_test::tp_moves
