// checkpoint_state_tool: a small model with BatchNorm (buffers: running_mean, running_var,
// num_batches_tracked), trained under fsdprun by the torch::optim optimizer of --optimizer, that
// saves and resumes sharded checkpoints as a user's program does (fsdp::save_checkpoint,
// fsdp::latest_checkpoint, fsdp::load_sharded). tests/bad_checkpoint_table.py edits what it saves
// (buffers, optimizer state) and resumes with it, or with another optimizer: every refusal must
// be one line, naming the cause, the file or entry and the fix. Rank 0 prints
//   resumed_step N        after --load
//   saved FOLDER          after --save
// --dump-full-state PATH: rank 0 writes the full parameters, buffers and optimizer state as saved
// (tests/dcp_interop_e2e.py compares them with what torch.distributed.checkpoint reads).
#include "test_models.h"

#include <fsdp/checkpoint.h>
#include <fsdp/fsdp.h>
#include <fsdp/fused_adamw.h>
#include <fsdp/muon.h>

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

// The optimizers of --optimizer: one, or Muon and AdamW (Keller Jordan's split).
std::vector<std::unique_ptr<torch::optim::Optimizer>> make_optimizers(const std::string& name,
                                                                      torch::nn::Module& model) {
  std::vector<std::unique_ptr<torch::optim::Optimizer>> out;
  if (name == "muon+adamw") {
    auto split = fsdp::optim::split_for_muon(model);
    out.push_back(std::make_unique<fsdp::optim::Muon>(split.matrices, fsdp::optim::MuonOptions(0.02)));
    out.push_back(std::make_unique<fsdp::optim::AdamW>(split.others, torch::optim::AdamWOptions(0.01)));
  } else {
    out.push_back(make_optimizer(name, model.parameters()));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a small sharded model with BatchNorm, resuming from and saving sharded checkpoints."};
  std::string optimizer_name = "sgd", load_dir, save_dir, full_state_path;
  int64_t steps = 2;
  app.add_option("--optimizer", optimizer_name, "sgd (momentum 0.9) | adam | adamw | rmsprop | adagrad | muon+adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw", "rmsprop", "adagrad", "muon+adamw"}));
  app.add_option("--dump-full-state", full_state_path,
                 "with --save: rank 0 writes the full parameters, buffers and optimizer state here");
  app.add_option("--steps", steps, "steps to train (after the resumed step)");
  app.add_option("--load", load_dir, "resume from the latest checkpoint in this directory");
  app.add_option("--save", save_dir, "save a checkpoint into this directory at the end");
  CLI11_PARSE(app, argc, argv);

  try {
    auto dist = fsdp::init_distributed();
    torch::manual_seed(11);  // the same initial model on every rank
    auto model = fsdp::fully_shard(fsdp_test::BatchNormNet(), *dist->world);
    const auto owned = make_optimizers(optimizer_name, *model);
    std::vector<torch::optim::Optimizer*> optimizers;
    for (const auto& o : owned) optimizers.push_back(o.get());
    int64_t step = 0;
    if (!load_dir.empty()) {
      const std::string path = fsdp::latest_checkpoint(load_dir);
      TORCH_CHECK(!path.empty(), "--load: no checkpoint in ", load_dir);
      step = fsdp::load_sharded(model, optimizers, path).at("step").get<int64_t>();
      if (dist->rank() == 0) std::printf("resumed_step %lld\n", static_cast<long long>(step));
    }
    for (const int64_t last = step + steps; step < last; ++step) {
      auto gen = at::detail::createCPUGenerator(500 + step);  // the same batch on every rank
      const auto x = torch::randn({8, 5}, gen), y = torch::randn({8, 3}, gen);
      for (auto* o : optimizers) o->zero_grad();
      torch::mse_loss(model(x), y).backward();
      for (auto* o : optimizers) o->step();
    }
    if (!save_dir.empty()) {
      const std::string folder = fsdp::save_checkpoint(model, optimizers, save_dir, step, {{"step", step}});
      if (!full_state_path.empty()) {
        auto full = fsdp::gather_full_params(model);
        for (auto& item : fsdp::gather_full_optimizer_state(model, optimizers)) full.push_back(item);
        if (dist->rank() == 0) fsdp::save_tensor_dict(full_state_path, full);
      }
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
