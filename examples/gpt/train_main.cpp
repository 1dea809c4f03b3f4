// gpt_train: trains the byte-level GPT with FSDP over the ranks that fsdprun or torchrun started,
// or (--reference) unsharded in one process on the same global batches.
#include "gpt_plan.h"
#include "pipeline_plan.h"
#include "checkpointing.h"
#include "command_line.h"
#include "trainer.h"

#include <fsdp/peer_errors.h>
#include <fsdp/replica_quorum.h>

#include <CLI/CLI.hpp>
#include <torch/cuda.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <utility>

namespace {

// This process's rank and the world size, from the launcher's variables (the rendezvous reads
// them again; a missing or malformed one is named here already).
std::pair<int, int> launch_rank() {
  const fsdp::LaunchEnv env = fsdp::LaunchEnv::from_environment();
  return {env.rank, env.world_size};
}

// The GPU of --device cuda[:N]. "cuda": this rank's, cuda:(LOCAL_RANK % GPUs) (several ranks on
// one GPU need FSDP_CUDA_COLLECTIVES=staged); the reference, one process, takes cuda:0.
c10::Device gpu(const std::string& device, const fsdp::Distributed* dist) {
  if (device != "cuda") return c10::Device(device);
  const int local_rank = dist ? dist->env.local_rank : 0;
  return c10::Device(c10::kCUDA,
                     static_cast<c10::DeviceIndex>(local_rank % torch::cuda::device_count()));
}

void print_result(const gpt::TrainResult& result) {
  if (!result.sample.empty()) {
    std::cout << "--- sample ---\n" << result.sample << "\n--------------\n";
  }
  if (result.summary.steps() > 0) {
    std::printf("loss: first %.4f last %.4f\n", result.summary.first_loss(), result.summary.last_loss());
  }
}

// --fault-tolerant: this process replaces a rank of a lost replica (FSDP_REPLICA_INCARNATION > 0),
// so the folders it finds filled are the running job's own.
bool replaces_a_rank() {
  const char* incarnation = std::getenv("FSDP_REPLICA_INCARNATION");
  return incarnation && *incarnation && std::string(incarnation) != "0";
}

// --fault-tolerant: replicas of --shard-group-size ranks (default LOCAL_WORLD_SIZE), each sharded
// FULL_SHARD over its own ranks; they meet in the quorum only.
fsdp::Replicas join_replicas(gpt::TrainOptions& o) {
  const fsdp::LaunchEnv env = fsdp::LaunchEnv::from_environment();
  const int f = o.fsdp.shard_group_size() > 0 ? o.fsdp.shard_group_size() : env.local_world_size;
  const auto vote_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.replica_vote_timeout_s * 1000));
  fsdp::Replicas replicas = fsdp::init_replicas(f, {}, vote_timeout);
  o.fsdp.strategy(fsdp::ShardingStrategy::FullShard).shard_group_size(0);
  return replicas;
}

// A failure inside a replica loses the replica, not the job: the quorum stops waiting for it and
// the process exits with kReplicaLostExit for the launcher to replace it.
gpt::TrainResult train_replica(const gpt::TrainOptions& o, fsdp::Replicas& replicas) {
  try {
    return gpt::train(o, replicas.dist.get(), replicas.quorum.get());
  } catch (const c10::Error& e) {
    replicas.quorum->mark_lost();
    throw fsdp::ReplicaLost(fsdp::name_peer_ranks(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    replicas.quorum->mark_lost();
    throw fsdp::ReplicaLost(e.what());
  }
}

// The run of valid flags: files and folders checked before the rendezvous and any work (rank 0
// holds --checkpoint-dir while it runs), then training; rank 0 prints the result.
void run(gpt::CommandLine& cl) {
  gpt::TrainOptions& o = cl.train;
  const auto [rank, world_size] = cl.reference ? std::pair{0, 1} : launch_rank();
  gpt::check_paths(o, rank, world_size);
  // An existing folder is locked before the rendezvous (a second run is refused at once); a
  // missing one only once the run cannot be refused before training, since locking creates it.
  auto checkpoint_dir_lock = gpt::lock_checkpoint_dir(o, rank, /*create=*/false);
  if (rank == 0 && !replaces_a_rank()) gpt::check_checkpoint_dir(o);
  std::shared_ptr<fsdp::Distributed> dist;
  std::optional<fsdp::Replicas> replicas;
  if (o.fault_tolerant) {
    replicas = join_replicas(o);
    dist = replicas->dist;
  } else if (!cl.reference) {
    dist = fsdp::init_distributed();
  }
  // --device cpu leaves it unset: the CPU, the parameters' device (the reference reads it too).
  if (cl.device != "cpu") o.fsdp.device(gpu(cl.device, dist.get()));
  std::optional<fsdp::Plan> plan;
  std::optional<fsdp::PipelinePlan> pipeline_plan;
  if (cl.autoplan && o.pp > 0) {
    pipeline_plan = gpt::choose_pipeline(o, cl.planner, *dist);
  } else if (cl.autoplan) {
    plan = gpt::choose_configuration(o, cl.planner, *dist, cl.replaced_by_auto);
  }
  if (!checkpoint_dir_lock && rank == 0) {
    checkpoint_dir_lock = gpt::lock_checkpoint_dir(o, rank, /*create=*/true);
    if (!replaces_a_rank()) gpt::check_checkpoint_dir(o);  // another run may have filled it meanwhile
  }
  o.gather_final_params = false;  // print_result reads the summary and the sample only
  o.keep_step_records = false;
  gpt::TrainResult result;
  if (replicas) {
    result = train_replica(o, *replicas);
  } else {
    result = gpt::train(o, dist.get());
  }
  if (rank == 0) print_result(result);
  if (plan) gpt::check_plan_against_run(*plan, o, result, cl.planner, *dist);
  if (pipeline_plan) gpt::check_pipeline_plan_against_run(*pipeline_plan, o, result, cl.planner, *dist);
}

// gpt_train --plan: the plan of the flags' run (rank 0 alone prints when launched), no training.
int print_plan(gpt::CommandLine& cl) {
  const char* rank = std::getenv("RANK");
  if (rank && std::string(rank) != "0") return 0;
  gpt::print_plan(cl.train, gpt::setup_of_flags(cl.train, cl.planner), cl.planner);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a byte-level GPT with fully sharded data parallelism (FSDP)."};
  gpt::CommandLine command_line;
  gpt::add_options(app, command_line);
  gpt::add_planner_options(app, command_line, /*run_flags=*/true);
  CLI11_PARSE(app, argc, argv);
  const std::string error = command_line.plan ? gpt::finish_plan_options(app, command_line)
                                              : gpt::finish_options(app, command_line);
  if (!error.empty()) {
    std::cerr << "gpt_train: error: " << error << std::endl;
    return 2;
  }
  try {
    if (command_line.plan) return print_plan(command_line);
    run(command_line);
  } catch (const fsdp::ReplicaLost& e) {
    std::cerr << "gpt_train: replica lost: " << e.what() << std::endl;
    return fsdp::kReplicaLostExit;
  } catch (const c10::Error& e) {
    std::cerr << "gpt_train: error: " << fsdp::name_peer_ranks(e.what_without_backtrace())
              << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "gpt_train: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
