#include "plan_tp_moves.h"

#include "plan_counting.h"
#include "tensor_parallel_plan.h"

#include <algorithm>

namespace gpt {

namespace {

// The modules of `table`: each row's path and the groups above it ("attn" before "attn.q_proj"),
// once each, in the table's order.
std::vector<std::string> styled_module_paths(const std::vector<Layer>& table) {
  std::vector<std::string> paths;
  const auto add = [&](const std::string& path) {
    if (std::find(paths.begin(), paths.end(), path) == paths.end()) paths.push_back(path);
  };
  for (const Layer& layer : table) {
    for (size_t dot = layer.name.find('.'); dot != std::string::npos; dot = layer.name.find('.', dot + 1)) {
      add(layer.name.substr(0, dot));
    }
    add(layer.name);
  }
  return paths;
}

bool is_norm_row(const Layer& layer) { return layer.kind == LayerKind::LayerNorm || layer.kind == LayerKind::RMSNorm; }

// The module at `path` as moves_of reads it: its rows (the row itself, or a group's, listed in
// forward order: its input is its first row's), their parameters named below it.
fsdp::tp::StyledShape styled_shape_of(const std::vector<Layer>& table, const std::string& path, int64_t seq) {
  fsdp::tp::StyledShape shape;
  shape.sequence = seq;
  bool first = true;
  for (const Layer& layer : table) {
    const bool own = layer.name == path;
    if (!own && layer.name.rfind(path + ".", 0) != 0) continue;
    if (first) shape.in_features = layer.in;
    first = false;
    shape.out_features = is_norm_row(layer) ? layer.in : layer.out;
    shape.embedding = own && layer.kind == LayerKind::Embedding;
    for (const fsdp::PlanParam& param : layer_params(layer, "")) {
      shape.params.push_back({param.name.substr(path.size() + 1), param.numel()});
    }
  }
  return shape;
}

fsdp::PlanTpCollective planned_collective(const fsdp::tp::Move& move, const std::string& path, int64_t e, int64_t tp) {
  static constexpr fsdp::PlanTpCollective::Kind kinds[] = {fsdp::PlanTpCollective::AllGather,
                                                           fsdp::PlanTpCollective::ReduceScatter,
                                                           fsdp::PlanTpCollective::AllReduce};
  const std::string parameter = move.parameter.empty() ? "" : path + "." + move.parameter;
  return {kinds[move.kind], path + "'s " + move.what, move.backward, move.per_sequence,
          must_fit(fsdp::tp::sent_bytes(move, tp, e)), parameter};
}

}  // namespace

std::vector<fsdp::PlanTpCollective> styled_tp_collectives(const std::vector<Layer>& table, const std::string& prefix,
                                                          const fsdp::tp::ParallelizePlan& plan, int64_t seq,
                                                          int64_t e, int64_t tp) {
  std::vector<fsdp::PlanTpCollective> out;
  if (tp == 1) return out;
  for (const std::string& path : styled_module_paths(table)) {
    const fsdp::tp::ParallelStyle* style = fsdp::tp::style_for(plan, path);
    if (!style) continue;
    fsdp::tp::StyledShape shape = styled_shape_of(table, path, seq);
    shape.input_prepared = fsdp::tp::input_prepared(plan, path);
    for (const fsdp::tp::Move& move : fsdp::tp::moves_of(*style, shape)) out.push_back(planned_collective(move, prefix + path, e, tp));
  }
  return out;
}

std::vector<fsdp::PlanTpCollective> root_tp_collectives(const GPTConfig& config, const GptLayers& layers, int64_t e,
                                                        int64_t tp) {
  using Move = fsdp::tp::Move;
  const int64_t T = config.max_seq;
  std::vector<fsdp::PlanTpCollective> out = styled_tp_collectives(layers.root(), "", root_parallel_plan(config), T, e, tp);
  if (tp == 1) return out;
  if (config.head_is_wte()) {
    // gpt.cpp's tied head gathers its input along the sequence itself, as a PrepareModuleInput
    // would (backward reduce-scatters the gradient).
    fsdp::tp::StyledShape head;
    head.sequence = T;
    head.in_features = config.dim;
    for (const Move& move : fsdp::tp::moves_of(fsdp::tp::PrepareModuleInput(), head)) {
      out.push_back(planned_collective(move, "the tied head", e, tp));
    }
  }
  // The loss's own (tp->cross_entropy, src/tp/loss_parallel.cpp), in fp32: each rank's row maxima
  // gathered ([tp, T] whole), each row's two sums all-reduced.
  out.push_back(planned_collective({Move::AllGather, false, "row maxima", product({tp, T}), true, ""}, "the loss", 4, tp));
  out.push_back(planned_collective({Move::AllReduce, false, "sums", product({2, T}), true, ""}, "the loss", 4, tp));
  return out;
}

}  // namespace gpt
