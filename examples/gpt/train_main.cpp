// gpt_train: trains the byte-level GPT with FSDP over the ranks that fsdprun or torchrun started,
// or (--reference) unsharded in one process on the same global batches.
#include "trainer.h"

#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char** argv) {
  CLI::App app{"Train a byte-level GPT with fully sharded data parallelism (FSDP)."};
  gpt::TrainOptions o;
  bool reference = false;
  app.add_option("--layers", o.model.layers, "transformer blocks (one FSDP unit each)");
  app.add_option("--dim", o.model.dim, "model width");
  app.add_option("--heads", o.model.heads, "attention heads");
  app.add_option("--seq", o.model.max_seq, "sequence length");
  app.add_option("--batch", o.batch, "sequences per rank per step");
  app.add_option("--steps", o.steps, "optimizer steps");
  app.add_option("--lr", o.lr, "AdamW peak learning rate");
  app.add_option("--warmup-steps", o.warmup_steps,
                 "linear warm-up steps, then cosine decay to lr/10 (0: constant lr)");
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay on matrices");
  app.add_option("--seed", o.seed, "seed of the initial weights and of the batches");
  app.add_option("--data", o.data, "a text file or a folder of text files")->required();
  app.add_option("--max-data-mb", o.max_data_bytes, "read at most this many MiB of text")
      ->transform([](const std::string& mb) { return std::to_string(std::stoll(mb) << 20); });
  app.add_option("--metrics", o.metrics_path, "JSON lines per step; {rank} becomes the rank");
  app.add_option("--log-every", o.log_every, "print a progress line every N steps (rank 0)");
  app.add_option("--sample", o.sample_bytes, "generate N bytes after training");
  app.add_option("--prompt", o.sample_prompt, "prompt of the sample");
  app.add_option("--init-from", o.init_from,
                 "start from these full parameters (a torch.save dict of name -> tensor)");
  app.add_option("--save-full", o.save_full,
                 "rank 0 writes the full parameters here after training (--steps 0: the initial ones)");
  app.add_option("--dump-batches", o.dump_batches,
                 "rank 0 writes every global batch of the run here ({inputs, targets}, torch.load)");
  app.add_option("--trace", o.trace,
                 "Chrome trace (Perfetto) of one step per rank; {rank} becomes the rank");
  std::string strategy = "full";
  int shard_group_size = 0;
  app.add_option("--strategy", strategy, "full | grad_op | none | hybrid | hybrid_grad_op")
      ->check(CLI::IsMember({"full", "grad_op", "none", "hybrid", "hybrid_grad_op"}));
  app.add_option("--shard-group-size", shard_group_size,
                 "hybrid strategies: ranks per shard group (default: LOCAL_WORLD_SIZE)");
  std::string backward_prefetch = "pre";
  int limit_all_gathers = o.fsdp.limit_all_gathers();
  bool forward_prefetch = false, check_order = false;
  app.add_option("--backward-prefetch", backward_prefetch, "pre | post | none")
      ->check(CLI::IsMember({"pre", "post", "none"}));
  app.add_flag("--forward-prefetch", forward_prefetch, "all-gather the next unit before forward");
  app.add_option("--limit-all-gathers", limit_all_gathers,
                 "rate limiter: units holding unsharded memory at once (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--check-order", check_order,
               "debug: check in the first step that all ranks run units in the same order");
  std::string param_dtype, reduce_dtype;
  bool activation_checkpointing = false;
  const auto dtypes = CLI::IsMember({"fp32", "bf16", "fp16"});
  app.add_option("--param-dtype", param_dtype,
                 "mixed precision: compute dtype of forward/backward and the all-gathers "
                 "(fp32 masters stay sharded; fp16 adds a sharded gradient scaler)")
      ->check(dtypes);
  app.add_option("--reduce-dtype", reduce_dtype,
                 "mixed precision: dtype of the gradient reductions (default: --param-dtype)")
      ->check(dtypes);
  app.add_option("--loss-scale", o.loss_scale, "fp16: initial scale of the sharded gradient scaler")
      ->check(CLI::PositiveNumber);
  app.add_flag("--deferred-init", o.deferred_init,
               "build, initialise and shard one block at a time (set-up memory: sharded model + one "
               "block); initial values differ from the eager build's (other random order)");
  app.add_option("--freeze", o.freeze,
                 "parameters whose name contains this do not train (repeatable; with "
                 "--deferred-init a block's names lack the 'h.N.' prefix)");
  app.add_flag("--activation-checkpointing", activation_checkpointing,
               "recompute each block's forward in backward instead of keeping its activations");
  app.add_flag("--reference", reference, "train unsharded in this process on the global batch");
  app.add_option("--world-size", o.reference_world_size,
                 "with --reference: the world size whose global batch to train on")
      ->check(CLI::PositiveNumber);
  app.add_option("--grad-accum", o.grad_accum, "micro-batches per step (gradient accumulation)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-sync", o.no_sync,
               "accumulate micro-batches without communication (one reduction per step)");
  app.add_option("--clip", o.clip, "clip the global gradient norm to this value (0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--save-every", o.save_every, "save a sharded checkpoint every N steps and at the end")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "folder of sharded checkpoints (step-N/ and latest)");
  app.add_flag("--resume", o.resume,
               "continue from the newest checkpoint in --checkpoint-dir (none: start at step 0)");
  CLI11_PARSE(app, argc, argv);
  o.fsdp.strategy(fsdp::parse_sharding_strategy(strategy))
      .shard_group_size(shard_group_size)
      .backward_prefetch(fsdp::parse_backward_prefetch(backward_prefetch))
      .forward_prefetch(forward_prefetch)
      .limit_all_gathers(limit_all_gathers)
      .check_execution_order(check_order)
      .activation_checkpointing(activation_checkpointing);
  auto& precision = o.fsdp.mixed_precision();
  if (!param_dtype.empty()) precision.param_dtype(fsdp::parse_dtype(param_dtype));
  if (!reduce_dtype.empty()) precision.reduce_dtype(fsdp::parse_dtype(reduce_dtype));

  try {
    std::shared_ptr<fsdp::Distributed> dist;
    if (!reference) dist = fsdp::init_distributed();
    auto result = gpt::train(o, dist.get());
    if (!result.sample.empty() && (!dist || dist->rank() == 0)) {
      std::cout << "--- sample ---\n" << result.sample << "\n--------------\n";
    }
    if (!result.losses.empty() && (!dist || dist->rank() == 0)) {
      std::printf("loss: first %.4f last %.4f\n", result.losses.front(), result.losses.back());
    }
  } catch (const c10::Error& e) {
    std::cerr << "gpt_train: error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "gpt_train: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
