// What each parallel style moves, without tensors (parallelize.h's moves_of, [Note: a style's
// two readers]): the collectives src/tp/parallel_styles.cpp's layers and parallelize.cpp's
// gradient hooks issue, listed from the style and the layer's sizes for the planner.
#include <fsdp/parallelize.h>

#include <fsdp/checked_math.h>

#include <c10/util/Exception.h>

namespace fsdp::tp {

namespace {

// An activation of `features` per token over a whole sequence: its elements per sequence.
int64_t activation_elements(const StyledShape& shape, int64_t features) {
  const auto n = checked_mul(shape.sequence, features);
  TORCH_CHECK(n, "moves_of: a sequence of ", shape.sequence, " tokens of ", features,
              " features has more elements than int64 counts");
  return *n;
}

Move forward_move(Move::Kind kind, std::string what, int64_t elements) {
  return {kind, /*backward=*/false, std::move(what), elements, /*per_sequence=*/true, ""};
}

Move backward_move(Move::Kind kind, std::string what, int64_t elements) {
  return {kind, /*backward=*/true, std::move(what), elements, /*per_sequence=*/true, ""};
}

// ColwiseLayer::run: its input gathered (ShardSequence) or copied in (Replicate: the gradient
// summed), unless a parent's PrepareModuleInput gathered it; a Replicate output gathered along
// the features (its backward keeps this rank's chunk: nothing moves).
void colwise_moves(const ColwiseParallel& style, const StyledShape& shape, std::vector<Move>& out) {
  const int64_t in = activation_elements(shape, shape.in_features);
  if (!shape.input_prepared && style.input_layout() == Layout::ShardSequence) {
    out.push_back(forward_move(Move::AllGather, "input", in));
  }
  if (style.output_layout() == Layout::Replicate) {
    out.push_back(forward_move(Move::AllGather, "output", activation_elements(shape, shape.out_features)));
  }
  if (shape.input_prepared) return;  // the parent's gather's backward sums the gradient, once
  out.push_back(backward_move(style.input_layout() == Layout::ShardSequence ? Move::ReduceScatter : Move::AllReduce,
                         "input's gradient", in));
}

// RowwiseLinearLayer::run and VocabParallelEmbedding::run: the partial output reduce-scattered
// along the sequence (backward gathers its gradient) or all-reduced (backward: the identity).
void rowwise_moves(const RowwiseParallel& style, const StyledShape& shape, std::vector<Move>& out) {
  const int64_t y = activation_elements(shape, shape.out_features);
  if (style.output_layout() == Layout::ShardSequence) {
    out.push_back(forward_move(Move::ReduceScatter, "output", y));
    out.push_back(backward_move(Move::AllGather, "output's gradient", y));
  } else {
    out.push_back(forward_move(Move::AllReduce, "output", y));
  }
}

// PreparedInputLayer::run: gathered (backward reduce-scatters) or chunked (backward gathers).
void prepared_moves(const PrepareModuleInput& style, const StyledShape& shape, std::vector<Move>& out) {
  const int64_t in = activation_elements(shape, shape.in_features);
  if (style.desired_input_layout() == Layout::Replicate) {
    out.push_back(forward_move(Move::AllGather, "input", in));
    out.push_back(backward_move(Move::ReduceScatter, "input's gradient", in));
  } else {
    out.push_back(backward_move(Move::AllGather, "input's gradient", in));
  }
}

}  // namespace

bool input_prepared(const ParallelizePlan& plan, const std::string& path) {
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', dot + 1)) {
    const ParallelStyle* style = style_for(plan, path.substr(0, dot));
    const auto* prepare = style ? std::get_if<PrepareModuleInput>(style) : nullptr;
    if (prepare && prepare->desired_input_layout() == Layout::Replicate) return true;
  }
  return false;
}

std::vector<Move> moves_of(const ParallelStyle& style, const StyledShape& shape) {
  std::vector<Move> out;
  if (const auto* col = std::get_if<ColwiseParallel>(&style)) colwise_moves(*col, shape, out);
  if (const auto* row = std::get_if<RowwiseParallel>(&style)) rowwise_moves(*row, shape, out);
  if (const auto* prepare = std::get_if<PrepareModuleInput>(&style)) prepared_moves(*prepare, shape, out);
  // parallelize.cpp's sum_gradient_over_ranks: one all-reduce per backward of each such gradient.
  for (const auto& [name, elements] : shape.params) {
    if (!split_of(style, name, shape.embedding).gradient_summed) continue;
    out.push_back({Move::AllReduce, /*backward=*/true, name + "'s gradient", elements, /*per_sequence=*/false, name});
  }
  return out;
}

std::optional<int64_t> sent_bytes(const Move& move, int64_t tp_size, int64_t element_bytes) {
  const int64_t steps = move.kind == Move::AllReduce ? 2 : 1;  // an all-reduce: reduce-scatter + all-gather
  const auto bytes = checked_product({steps, tp_size - 1, move.elements, element_bytes});
  if (!bytes) return std::nullopt;
  return *bytes / tp_size;
}

}  // namespace fsdp::tp
