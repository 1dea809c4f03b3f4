#include "batch_dump.h"

#include <fsdp/state_dict.h>

#include <vector>

namespace gpt {

void dump_batches(const TrainOptions& o, const Corpus& corpus, int world) {
  const int64_t global_rows = o.grad_accum * world * o.batch;
  std::vector<torch::Tensor> inputs, targets;
  for (int64_t step = 0; step < o.steps; ++step) {
    auto [x, y] = corpus.batch(o.seed, step, 0, global_rows, o.model.max_seq);
    inputs.push_back(x);
    targets.push_back(y);
  }
  auto stacked = [&](const std::vector<torch::Tensor>& rows) {
    return rows.empty() ? torch::empty({0, global_rows, o.model.max_seq}, torch::kLong)
                        : torch::stack(rows);
  };
  fsdp::save_tensor_dict(o.dump_batches, {{"inputs", stacked(inputs)}, {"targets", stacked(targets)}});
}

}  // namespace gpt
