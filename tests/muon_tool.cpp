// fsdp::optim::Muon given chosen gradients, for tests/muon_reference_e2e.py, which steps
// torch.optim.Muon in Python on the unsharded matrices with the same gradients and compares
// the parameters bit for bit. Reads the initial matrices ("<name>") and each step's gradients
// ("step<k>.<name>") from a safetensors file; for each choice of nesterov and adjust_lr_fn trains
// a fresh model `--steps` steps and writes its full parameters to <out>/<case>.safetensors
// (rank 0). `--unsharded`: the same model without fully_shard (Muon's whole-matrix path).
// `--tp N`: the model split over N tensor-parallel ranks first (tall column-wise, wide row-wise,
// square column-wise as two fused parts; small and mix replicated), then sharded over the
// data-parallel ranks: each rank's gradient is its piece of its part of the whole one.
#include <fsdp/fsdp.h>
#include <fsdp/safetensors.h>

#include "core/sharded_view.h"

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <string>

namespace {

// Three units of one matrix each (tall, wide, square) and two matrices in the root (a small one
// whose pieces are empty on some ranks, and a bare parameter): the awkward cases of a placement.
struct MuonNetImpl : torch::nn::Module {
  MuonNetImpl() {
    tall = register_module("tall", torch::nn::Linear(torch::nn::LinearOptions(20, 48).bias(false)));
    wide = register_module("wide", torch::nn::Linear(torch::nn::LinearOptions(48, 20).bias(false)));
    square = register_module("square", torch::nn::Linear(torch::nn::LinearOptions(20, 20).bias(false)));
    small = register_module("small", torch::nn::Linear(torch::nn::LinearOptions(20, 5).bias(false)));
    mix = register_parameter("mix", torch::zeros({7, 5}));
    tall_unit = tall;
    wide_unit = wide;
    square_unit = square;
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::matmul(small(square_unit(wide_unit(tall_unit(x)))), mix.t());
  }
  // The plan's layers in their holders (parallelize_module refuses a plain member).
  fsdp::tp::Parallel<torch::nn::Linear> tall{nullptr}, wide{nullptr}, square{nullptr};
  torch::nn::Linear small{nullptr};
  torch::Tensor mix;
  fsdp::Unit<torch::nn::Linear> tall_unit, wide_unit, square_unit;
};
TORCH_MODULE(MuonNet);

void load_initial(MuonNet& model, const fsdp::SafetensorsReader& file) {
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) p.value().copy_(file.read(p.key()));
}

std::string gradient_name(int step, const std::string& param) { return "step" + std::to_string(step) + "." + param; }

// `steps` steps of `muon` on the unsharded model: each parameter's gradient whole.
fsdp::NamedTensors train(MuonNet& model, fsdp::optim::Muon& muon, const fsdp::SafetensorsReader& file, int steps) {
  for (int step = 0; step < steps; ++step) {
    for (auto& p : model->named_parameters()) p.value().mutable_grad() = file.read(gradient_name(step, p.key()));
    muon.step();
  }
  return model->named_parameters().pairs();
}

// This rank's part of `whole` under tensor parallelism (the whole without it).
at::Tensor tensor_parallel_part(const fsdp::detail::ShardedParam& piece, const at::Tensor& whole) {
  const auto& placement = piece.tensor_parallel();
  return placement ? fsdp::tp::part_of_whole(whole, *placement, placement->tp->rank()) : whole;
}

// The same on the sharded model: each rank's piece of each gradient.
fsdp::NamedTensors train(fsdp::Unit<MuonNet>& model, fsdp::optim::Muon& muon, const fsdp::SafetensorsReader& file,
                         int steps) {
  for (const auto& piece : fsdp::detail::ShardedView(model.sharded_model()).params()) {
    std::printf("piece %s %lld %lld\n", piece.name().c_str(), static_cast<long long>(piece.begin()),
                static_cast<long long>(piece.end()));
  }
  for (int step = 0; step < steps; ++step) {
    for (const auto& piece : fsdp::detail::ShardedView(model.sharded_model()).params()) {
      at::Tensor param = piece.param();
      const at::Tensor whole = file.read(gradient_name(step, piece.name()));
      param.mutable_grad() = piece.piece_of(tensor_parallel_part(piece, whole)).view(param.sizes()).clone();
    }
    fsdp::reset_comm_stats();  // the last step's bytes are printed
    muon.step();
  }
  return fsdp::gather_full_params(model.sharded_model());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Muon given chosen gradients (tests/muon_reference_e2e.py)"};
  std::string cases, out, strategy = "full";
  int steps = 3, shard_group_size = 0, tp_size = 1;
  bool unsharded = false;
  app.add_option("--cases", cases, "safetensors file of initial matrices and gradients")->required();
  app.add_option("--out", out, "folder for <case>.safetensors")->required();
  app.add_option("--steps", steps);
  app.add_option("--strategy", strategy);
  app.add_option("--shard-group-size", shard_group_size);
  app.add_flag("--unsharded", unsharded);
  app.add_option("--tp", tp_size, "tensor-parallel ranks (dividing the world)");
  CLI11_PARSE(app, argc, argv);

  auto dist = fsdp::init_distributed();
  std::unique_ptr<fsdp::DeviceMesh> mesh;
  std::shared_ptr<fsdp::tp::TensorParallel> tp;
  if (tp_size > 1) {
    mesh = std::make_unique<fsdp::DeviceMesh>(
        dist->world, std::vector<fsdp::MeshDim>{{"dp", dist->world_size() / tp_size}, {"tp", tp_size}});
    tp = std::make_shared<fsdp::tp::TensorParallel>(mesh->group_ptr("tp"));
  }
  fsdp::ProcessGroup& dp_group = mesh ? mesh->group("dp") : *dist->world;
  const fsdp::SafetensorsReader file(cases);
  for (bool nesterov : {true, false}) {
    for (std::string adjust : {"original", "match_rms_adamw"}) {
      const auto options =
          fsdp::optim::MuonOptions(0.02).weight_decay(0.1).momentum(0.95).nesterov(nesterov).adjust_lr_fn(adjust);
      MuonNet model;
      load_initial(model, file);
      fsdp::NamedTensors params;
      fsdp::optim::MuonWork work;
      if (unsharded) {
        fsdp::optim::Muon muon(model->parameters(), options);
        params = train(model, muon, file, steps);
        work = muon.last_step_work();
      } else {
        if (tp) {
          fsdp::tp::parallelize_module(*model, tp, {{"tall", fsdp::tp::ColwiseParallel()},
                                                    {"wide", fsdp::tp::RowwiseParallel()},
                                                    {"square", fsdp::tp::ColwiseParallel().fused_chunks(2)}});
        }
        auto sharded = fsdp::fully_shard(model, dp_group,
                                         fsdp::FullyShardOptions()
                                             .strategy(fsdp::parse_sharding_strategy(strategy))
                                             .shard_group_size(shard_group_size));
        fsdp::optim::Muon muon(sharded->parameters(), options);
        params = train(sharded, muon, file, steps);
        work = muon.last_step_work();
      }
      const std::string name = std::string(nesterov ? "nesterov" : "plain") + "-" + adjust;
      if (dist->rank() == 0) fsdp::save_safetensors(out + "/" + name + ".safetensors", params);
      std::string owned;
      for (const auto& matrix : work.names) owned += (owned.empty() ? "" : ",") + matrix;
      std::printf("case %s: owned %s flops %.0f all_to_all_bytes %lld\n", name.c_str(), owned.empty() ? "-" : owned.c_str(),
                  work.flops, static_cast<long long>(fsdp::comm_stats().all_to_all_bytes));
    }
  }
  return 0;
}
