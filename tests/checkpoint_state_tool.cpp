// checkpoint_state_tool: a small model with BatchNorm (buffers: running_mean, running_var,
// num_batches_tracked), trained under fsdprun by the torch::optim optimizer of --optimizer, that
// saves and resumes sharded checkpoints as a user's program does (fsdp::save_checkpoint,
// fsdp::latest_checkpoint, fsdp::load_sharded). tests/bad_checkpoint_table.py edits what it saves
// (buffers, optimizer state) and resumes with it, or with another optimizer: every refusal must
// be one line, naming the cause, the file or entry and the fix. Rank 0 prints
//   resumed_step N        after --load
//   saved FOLDER          after --save
#include "test_models.h"

#include <fsdp/checkpoint.h>
#include <fsdp/fsdp.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <memory>

namespace {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params) {
  namespace o = torch::optim;
  if (name == "sgd") return std::make_unique<o::SGD>(params, o::SGDOptions(0.1).momentum(0.9));
  if (name == "adam") return std::make_unique<o::Adam>(params, o::AdamOptions(0.01));
  if (name == "adamw") return std::make_unique<o::AdamW>(params, o::AdamWOptions(0.01));
  if (name == "rmsprop") {
    return std::make_unique<o::RMSprop>(params, o::RMSpropOptions(0.01).momentum(0.5).centered(true));
  }
  return std::make_unique<o::Adagrad>(params, o::AdagradOptions(0.1));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a small sharded model with BatchNorm, resuming from and saving sharded checkpoints."};
  std::string optimizer_name = "sgd", load_dir, save_dir;
  int64_t steps = 2;
  app.add_option("--optimizer", optimizer_name, "sgd (momentum 0.9) | adam | adamw | rmsprop | adagrad")
      ->check(CLI::IsMember({"sgd", "adam", "adamw", "rmsprop", "adagrad"}));
  app.add_option("--steps", steps, "steps to train (after the resumed step)");
  app.add_option("--load", load_dir, "resume from the latest checkpoint in this directory");
  app.add_option("--save", save_dir, "save a checkpoint into this directory at the end");
  CLI11_PARSE(app, argc, argv);

  try {
    auto dist = fsdp::init_distributed();
    torch::manual_seed(11);  // the same initial model on every rank
    auto model = fsdp::fully_shard(fsdp_test::BatchNormNet(), *dist->world);
    auto optimizer = make_optimizer(optimizer_name, model->parameters());
    int64_t step = 0;
    if (!load_dir.empty()) {
      const std::string path = fsdp::latest_checkpoint(load_dir);
      TORCH_CHECK(!path.empty(), "--load: no checkpoint in ", load_dir);
      step = fsdp::load_sharded(model, *optimizer, path).at("step").get<int64_t>();
      if (dist->rank() == 0) std::printf("resumed_step %lld\n", static_cast<long long>(step));
    }
    for (const int64_t last = step + steps; step < last; ++step) {
      auto gen = at::detail::createCPUGenerator(500 + step);  // the same batch on every rank
      const auto x = torch::randn({8, 5}, gen), y = torch::randn({8, 3}, gen);
      optimizer->zero_grad();
      torch::mse_loss(model(x), y).backward();
      optimizer->step();
    }
    if (!save_dir.empty()) {
      const std::string folder = fsdp::save_checkpoint(model, *optimizer, save_dir, step, {{"step", step}});
      if (dist->rank() == 0) std::printf("saved %s\n", folder.c_str());
    }
    std::fflush(stdout);
  } catch (const c10::Error& e) {
    std::cerr << "checkpoint_state_tool: error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {  // never "terminate called": one line, whatever threw
    std::cerr << "checkpoint_state_tool: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
