#include "checkpointing.h"

#include <fsdp/checkpoint.h>

#include <cstdio>

namespace gpt {

namespace {

constexpr int kKeepLast = 2;  // step folders kept: the newest, and one to fall back on

nlohmann::json describe_run(const TrainOptions& o, int64_t next_step) {
  return {{"step", next_step},
          {"seed", o.seed},
          {"batch_per_rank", o.batch},
          {"model", {{"layers", o.model.layers}, {"dim", o.model.dim}, {"heads", o.model.heads},
                     {"seq", o.model.max_seq}, {"vocab", o.model.vocab_size}}}};
}

}  // namespace

int64_t resume_from_checkpoint(fsdp::Unit<GPT>& model, torch::optim::AdamW& optimizer,
                               const std::string& dir, const TrainOptions& o, int rank) {
  TORCH_CHECK(!dir.empty(), "--resume needs --checkpoint-dir");
  const std::string path = fsdp::latest_checkpoint(dir);
  if (path.empty()) return 0;  // nothing saved yet: a first run
  const nlohmann::json extra = fsdp::load_sharded(model, optimizer, path);
  const int64_t step = extra.at("step").get<int64_t>();
  TORCH_CHECK(extra.at("seed").get<uint64_t>() == o.seed, path, " was trained with --seed ",
              extra.at("seed").get<uint64_t>(), " but this run has --seed ", o.seed,
              ": its batches would differ (pass --seed ", extra.at("seed").get<uint64_t>(), ")");
  if (rank == 0) {
    std::printf("resumed from %s at step %lld\n", path.c_str(), static_cast<long long>(step));
    std::fflush(stdout);
  }
  return step;
}

void save_checkpoint_if_due(fsdp::Unit<GPT>& model, torch::optim::AdamW& optimizer,
                            const std::string& dir, int64_t every, int64_t step,
                            const TrainOptions& o) {
  if (every <= 0) return;
  TORCH_CHECK(!dir.empty(), "--save-every needs --checkpoint-dir");
  const int64_t next_step = step + 1;
  if (next_step % every != 0 && next_step != o.steps) return;
  fsdp::save_checkpoint(model, optimizer, dir, next_step, describe_run(o, next_step), kKeepLast);
}

}  // namespace gpt
