// Single-process tests: the environment contract, options, the flat layout, data determinism,
// the unit holder.
#include <fsdp/fsdp.h>

#include "data.h"
#include "launch/environment_settings.h"
#include "core/flat_param.h"
#include "launch/gloo_backend.h"
#include "launch/host_placement.h"
#include "gpt.h"
#include "nonfinite_guard.h"

#include <gtest/gtest.h>

#include "error_of.h"

#include <sys/socket.h>

#include <cmath>
#include <cstdlib>
#include <map>

namespace {

// Sets the torchrun variables for one test and restores the previous environment afterwards.
class EnvGuard {
 public:
  EnvGuard() {
    for (const char* name : kNames) {
      const char* value = std::getenv(name);
      if (value) saved_[name] = value;
    }
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
  }
  ~EnvGuard() {
    for (const char* name : kNames) {
      auto it = saved_.find(name);
      if (it == saved_.end()) unsetenv(name); else setenv(name, it->second.c_str(), 1);
    }
  }

 private:
  static constexpr const char* kNames[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK",
                                           "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  std::map<std::string, std::string> saved_;
};

using fsdp_test::error_of;

TEST(LaunchEnv, ReadsTorchrunVariables) {
  EnvGuard env;
  auto launch = fsdp::LaunchEnv::from_environment();
  EXPECT_EQ(launch.rank, 1);
  EXPECT_EQ(launch.world_size, 2);
  EXPECT_EQ(launch.local_world_size, 2);
  EXPECT_EQ(launch.master_port, 29500);
}

TEST(LaunchEnv, MissingVariableNamesItself) {
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"}) {
    EnvGuard env;
    unsetenv(name);
    const std::string message = error_of([] { fsdp::LaunchEnv::from_environment(); });
    EXPECT_NE(message.find(std::string(name) + " is not set"), std::string::npos) << message;
    EXPECT_NE(message.find("fsdprun"), std::string::npos) << message;
  }
}

TEST(LaunchEnv, InconsistentVariableIsRejected) {
  EnvGuard env;
  setenv("RANK", "2", 1);  // WORLD_SIZE is 2
  std::string message = error_of([] { fsdp::LaunchEnv::from_environment(); });
  EXPECT_NE(message.find("RANK='2'"), std::string::npos) << message;
  setenv("RANK", "1", 1);
  setenv("MASTER_PORT", "http", 1);
  message = error_of([] { fsdp::LaunchEnv::from_environment(); });
  EXPECT_NE(message.find("MASTER_PORT='http'"), std::string::npos) << message;
}

fsdp::EnvLookup lookup_in(const std::map<std::string, std::string>& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

// srun -N 2 --ntasks-per-node 3: the fifth task is on the second node.
std::map<std::string, std::string> slurm_task() {
  return {{"SLURM_PROCID", "4"},          {"SLURM_NTASKS", "6"},
          {"SLURM_LOCALID", "1"},         {"SLURM_NODEID", "1"},
          {"SLURM_TASKS_PER_NODE", "3(x2)"}, {"SLURM_JOB_NODELIST", "gpu[07-08]"},
          {"SLURM_JOB_ID", "123456"}};
}

TEST(LaunchEnv, ReadsSlurmVariablesWithoutTorchruns) {
  auto env = fsdp::LaunchEnv::from(lookup_in(slurm_task()));
  EXPECT_EQ(env.launcher, "slurm");
  EXPECT_EQ(env.rank, 4);
  EXPECT_EQ(env.world_size, 6);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 3);
  EXPECT_EQ(env.master_addr, "gpu07");
  EXPECT_EQ(env.master_port, 10000 + 123456 % 20000);
  auto given = slurm_task();
  given["MASTER_ADDR"] = "10.1.2.3";
  given["MASTER_PORT"] = "29511";
  given["SLURM_STEP_TASKS_PER_NODE"] = "4,2";  // the step's own layout wins over the job's
  given["SLURM_NODEID"] = "0";
  given["SLURM_LOCALID"] = "3";
  env = fsdp::LaunchEnv::from(lookup_in(given));
  EXPECT_EQ(env.master_addr, "10.1.2.3");
  EXPECT_EQ(env.master_port, 29511);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.local_rank, 3);
}

TEST(LaunchEnv, ReadsOpenMpiVariablesWithoutTorchruns) {
  auto env = fsdp::LaunchEnv::from(lookup_in({{"OMPI_COMM_WORLD_RANK", "3"},
                                              {"OMPI_COMM_WORLD_SIZE", "4"},
                                              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                              {"MASTER_ADDR", "node0"},
                                              {"MASTER_PORT", "29400"}}));
  EXPECT_EQ(env.launcher, "openmpi");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 29400);
}

TEST(LaunchEnv, TorchrunsVariablesWinAndNameTheAgentStore) {
  auto given = slurm_task();
  given.insert({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"},
                {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1234"},
                {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "2"}});
  auto env = fsdp::LaunchEnv::from(lookup_in(given));
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.world_size, 2);
  EXPECT_TRUE(env.agent_store);
  EXPECT_EQ(env.restart_count, 2);
  given["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(fsdp::LaunchEnv::from(lookup_in(given)).agent_store);
}

TEST(LaunchEnv, NamesEveryMissingVariableOfItsLauncher) {
  std::string message = error_of([] {
    fsdp::LaunchEnv::from(lookup_in({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  });
  EXPECT_NE(message.find("MASTER_ADDR, MASTER_PORT are not set (an Open MPI rank"), std::string::npos)
      << message;
  EXPECT_NE(message.find("mpirun -x MASTER_ADDR="), std::string::npos) << message;
  auto task = slurm_task();
  task.erase("SLURM_JOB_NODELIST");
  task.erase("SLURM_JOB_ID");
  task.erase("SLURM_LOCALID");
  message = error_of([&] { fsdp::LaunchEnv::from(lookup_in(task)); });
  EXPECT_NE(message.find("SLURM_LOCALID, MASTER_ADDR, MASTER_PORT are not set (a Slurm task"),
            std::string::npos) << message;
  message = error_of([] { fsdp::LaunchEnv::from(lookup_in({{"RANK", "0"}, {"MASTER_ADDR", "x"}})); });
  EXPECT_NE(message.find("WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_PORT are not set"),
            std::string::npos) << message;
  task = slurm_task();
  task["SLURM_NODEID"] = "2";  // only two nodes in 3(x2)
  message = error_of([&] { fsdp::LaunchEnv::from(lookup_in(task)); });
  EXPECT_NE(message.find("SLURM_NODEID='2'"), std::string::npos) << message;
}

TEST(EnvironmentSettings, ReadsTheLibrarysVariables) {
  auto settings = fsdp::EnvironmentSettings::from(lookup_in({}));
  EXPECT_FALSE(settings.threads_chosen);
  EXPECT_FALSE(settings.timeout || settings.cpu_collectives || settings.cuda_collectives ||
               settings.local_world_size);
  EXPECT_EQ(settings.gloo_socket_ifname, "");
  settings = fsdp::EnvironmentSettings::from(lookup_in(
      {{"OMP_NUM_THREADS", "2"}, {"FSDP_TIMEOUT_SECONDS", "1.5"}, {"FSDP_CPU_COLLECTIVES", "ring"},
       {"FSDP_CUDA_COLLECTIVES", "staged"}, {"GLOO_SOCKET_IFNAME", "eth1"}, {"LOCAL_WORLD_SIZE", "3"}}));
  EXPECT_TRUE(settings.threads_chosen);
  EXPECT_EQ(settings.timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(settings.cpu_collectives, fsdp::CpuCollectives::Ring);
  EXPECT_EQ(settings.cuda_collectives, fsdp::CudaCollectives::Staged);
  EXPECT_EQ(settings.gloo_socket_ifname, "eth1");
  EXPECT_EQ(settings.local_world_size, 3);
  settings = fsdp::EnvironmentSettings::from(
      lookup_in({{"FSDP_CPU_COLLECTIVES", "shm"}, {"FSDP_CUDA_COLLECTIVES", "nccl"}}));
  EXPECT_EQ(settings.cpu_collectives, fsdp::CpuCollectives::SharedMemory);
  EXPECT_EQ(settings.cuda_collectives, fsdp::CudaCollectives::Nccl);
}

TEST(EnvironmentSettings, MalformedValuesNameTheVariable) {
  const std::pair<const char*, const char*> bad[] = {{"OMP_NUM_THREADS", "two"},
                                                     {"FSDP_TIMEOUT_SECONDS", "1e10"},
                                                     {"FSDP_CPU_COLLECTIVES", "bogus"},
                                                     {"FSDP_CUDA_COLLECTIVES", "bogus"}};
  for (const auto& [name, value] : bad) {
    const std::string message =
        error_of([&] { fsdp::EnvironmentSettings::from(lookup_in({{name, value}})); });
    EXPECT_NE(message.find(std::string(name) + "='" + value + "'"), std::string::npos) << message;
  }
}

// A blob as torch 2.13's Gloo writes it: the sockaddr_in's family (little-endian) at byte 18,
// then the port (network order) and the IPv4 address.
TEST(GlooAddress, ReadsThePortAndAddressOfTheKnownLayout) {
  std::vector<uint8_t> blob(40, 0);
  const uint8_t sockaddr[] = {AF_INET, 0, 0xA1, 0x22, 127, 0, 0, 1};
  std::copy(std::begin(sockaddr), std::end(sockaddr), blob.begin() + 18);
  const fsdp::GlooListeningAddress address = fsdp::parse_gloo_listening_address(blob);
  EXPECT_EQ(address.port, 0xA122);
  EXPECT_EQ(address.ipv4, "127.0.0.1");
}

TEST(GlooAddress, AnUnknownLayoutSaysSo) {
  for (const std::vector<uint8_t>& blob : {std::vector<uint8_t>(40, 0xFF), std::vector<uint8_t>(10, 0)}) {
    const std::string message = error_of([&] { fsdp::parse_gloo_listening_address(blob); });
    EXPECT_NE(message.find("not in the layout this build knows"), std::string::npos) << message;
  }
}

TEST(LaunchEnv, SlurmListsAreExpanded) {
  EXPECT_EQ(fsdp::first_slurm_node("gpu[07-09,12],cpu1"), "gpu07");
  EXPECT_EQ(fsdp::first_slurm_node("node3,node4"), "node3");
  EXPECT_EQ(fsdp::first_slurm_node("rack[2-3]-n[5,9]"), "rack2-n5");
  EXPECT_EQ(fsdp::parse_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(fsdp::parse_slurm_tasks_per_node("8"), (std::vector<int>{8}));
  EXPECT_NE(error_of([] { fsdp::parse_slurm_tasks_per_node("2(x3"); }).find("'2(x3'"), std::string::npos);
  EXPECT_NE(error_of([] { fsdp::first_slurm_node("gpu[1-2"); }).find("unclosed"), std::string::npos);
}

TEST(HostPlacement, WarnsNamingShardGroupsThatSpanHosts) {
  const std::vector<std::string> blocked = {"a", "a", "b", "b"};
  EXPECT_EQ(fsdp::shard_groups_spanning_hosts(blocked, 2), "");
  const std::vector<std::string> interleaved = {"a", "b", "a", "b"};
  const std::string warning = fsdp::shard_groups_spanning_hosts(interleaved, 2);
  EXPECT_NE(warning.find("2 of 2 shard groups span hosts"), std::string::npos) << warning;
  EXPECT_NE(warning.find("ranks 0-1 on a (rank 0), b (rank 1)"), std::string::npos) << warning;
  EXPECT_NE(warning.find("ranks 2-3 on a (rank 2), b (rank 3)"), std::string::npos) << warning;
  // 3 ranks on a, 3 on b, groups of 2: only the middle group spans.
  const std::string middle = fsdp::shard_groups_spanning_hosts({"a", "a", "a", "b", "b", "b"}, 2);
  EXPECT_NE(middle.find("1 of 3 shard groups"), std::string::npos) << middle;
  EXPECT_NE(middle.find("ranks 2-3 on a (rank 2), b (rank 3)"), std::string::npos) << middle;
}

TEST(Options, UnknownStrategyNamesTheValueAndTheChoices) {
  const std::string message = error_of([] { fsdp::parse_sharding_strategy("fulll"); });
  EXPECT_NE(message.find("'fulll'"), std::string::npos) << message;
  EXPECT_NE(message.find("'full'"), std::string::npos) << message;
  EXPECT_EQ(fsdp::parse_sharding_strategy("full"), fsdp::ShardingStrategy::FullShard);
}

TEST(Options, BadShardingOptionsNameTheValueAndTheFix) {
  using S = fsdp::ShardingStrategy;
  auto hybrid = [](int f) { return fsdp::FullyShardOptions().strategy(S::HybridShard).shard_group_size(f); };
  std::string message = error_of([&] { hybrid(3).validate(4); });
  EXPECT_NE(message.find("shard group size 3 does not divide the world size 4"), std::string::npos)
      << message;
  message = error_of([&] { hybrid(2).validate(2); });
  EXPECT_NE(message.find("single replica group"), std::string::npos) << message;
  EXPECT_NE(message.find("'full'"), std::string::npos) << message;
  message = error_of([&] { fsdp::FullyShardOptions().shard_group_size(2).validate(4); });
  EXPECT_NE(message.find("hybrid strategies only"), std::string::npos) << message;
  message = error_of([&] { fsdp::FullyShardOptions().limit_all_gathers(-1).validate(4); });
  EXPECT_NE(message.find("limit_all_gathers(-1)"), std::string::npos) << message;
  EXPECT_EQ(error_of([&] { hybrid(2).validate(4); }), "");
  EXPECT_EQ(hybrid(2).shard_group_size_for(4), 2);
  EXPECT_EQ(fsdp::FullyShardOptions().strategy(S::NoShard).shard_group_size_for(4), 1);
  EXPECT_EQ(fsdp::FullyShardOptions().strategy(S::ShardGradOp).shard_group_size_for(4), 4);
  // The hybrid default: the ranks of one host, as the world group learnt them at init (never read
  // from the environment at use); unknown, the whole world.
  EXPECT_EQ(hybrid(0).shard_group_size_for(8, 2), 2);
  EXPECT_EQ(hybrid(0).shard_group_size_for(8), 8);
  EXPECT_EQ(hybrid(4).shard_group_size_for(8, 2), 4);
  EXPECT_EQ(error_of([&] { hybrid(0).validate(4, 2); }), "");
  message = error_of([&] { hybrid(0).validate(4, 3); });
  EXPECT_NE(message.find("shard group size 3 does not divide"), std::string::npos) << message;
  for (const char* name : {"full", "grad_op", "none", "hybrid", "hybrid_grad_op"}) {
    EXPECT_STREQ(fsdp::to_string(fsdp::parse_sharding_strategy(name)), name);
  }
}

TEST(Options, DtypesThatCannotBeReducedAreRejectedNamingThem) {
  auto with = [](fsdp::MixedPrecision mp) { return fsdp::FullyShardOptions().mixed_precision(mp); };
  std::string message =
      error_of([&] { with(fsdp::MixedPrecision().param_dtype(at::kInt)).validate(2); });
  EXPECT_NE(message.find("param_dtype(Int)"), std::string::npos) << message;
  EXPECT_NE(message.find("at::kBFloat16"), std::string::npos) << message;
  message = error_of(
      [&] { with(fsdp::MixedPrecision().reduce_dtype(at::kFloat8_e4m3fn)).validate(2); });
  EXPECT_NE(message.find("reduce_dtype(Float8_e4m3fn)"), std::string::npos) << message;
  message = error_of([&] { with(fsdp::MixedPrecision().buffer_dtype(at::kBool)).validate(2); });
  EXPECT_NE(message.find("buffer_dtype(Bool)"), std::string::npos) << message;
  EXPECT_EQ(error_of([&] {
              with(fsdp::MixedPrecision().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat))
                  .validate(2);
            }),
            "");
  message = error_of([] { fsdp::parse_dtype("bfloat"); });
  EXPECT_NE(message.find("'bfloat'"), std::string::npos) << message;
  EXPECT_EQ(fsdp::parse_dtype("bf16"), at::kBFloat16);
  EXPECT_EQ(fsdp::parse_dtype("fp16"), at::kHalf);
}

// bf16 compute with fp32 reduction: the unsharded gradient is fp32 from the start, each bf16
// gradient cast exactly as it is copied in (the reduction then converts nothing); at W = 1 the
// gradients can go straight into the fp32 gradient shard, with no unsharded gradient at all.
TEST(FlatParam, GradientsAreKeptInTheReductionDtype) {
  for (const bool into_shard : {false, true}) {
    std::vector<std::pair<std::string, at::Tensor>> params{
        {"w", torch::zeros({3, 4}).requires_grad_()}, {"b", torch::zeros({5}).requires_grad_()}};
    fsdp::FlatParam flat(params, 0, 1, at::kBFloat16, std::nullopt, at::kFloat);
    EXPECT_EQ(flat.full_grad().scalar_type(), at::kFloat);
    flat.begin_full_grad(/*keep=*/false, into_shard);
    EXPECT_EQ(flat.grads_in_shard(), into_shard);
    const auto grad = (torch::randn({3, 4}) * 1e3).to(at::kBFloat16);
    flat.entries()[0].param.mutable_grad() = grad;
    flat.take_grad(0);
    flat.complete_full_grad();
    const at::Tensor sum = into_shard ? flat.grad_shard() : flat.full_grad();
    EXPECT_TRUE(torch::equal(sum.narrow(0, 0, 12).view({3, 4}), grad.to(at::kFloat)));
    EXPECT_TRUE(torch::equal(sum.narrow(0, 12, 5), torch::zeros({5})));  // no gradient: zero
    // Into the shard: the unsharded gradient's storage was never allocated.
    EXPECT_EQ(flat.full_grad().storage().nbytes() == 0, into_shard);
  }
}

TEST(FlatParam, ShardsPartitionEveryParameterForAnyWorldSize) {
  for (int world : {1, 2, 3, 5}) {
    std::vector<int64_t> covered(4, 0);
    const std::vector<int64_t> sizes{7, 1, 0, 12};
    int64_t shard_numel = 0;
    for (int rank = 0; rank < world; ++rank) {
      std::vector<std::pair<std::string, at::Tensor>> params;
      for (size_t i = 0; i < sizes.size(); ++i) {
        params.emplace_back("p" + std::to_string(i), torch::arange(sizes[i], torch::kFloat));
      }
      fsdp::FlatParam flat(params, rank, world);
      shard_numel = flat.shard_numel();
      EXPECT_EQ(flat.padded_numel() % world, 0);
      EXPECT_EQ(flat.numel(), 20);
      EXPECT_LT(flat.padded_numel() - flat.numel(), world);  // padding < W elements
      for (size_t i = 0; i < sizes.size(); ++i) {
        const auto& e = flat.entries()[i];
        covered[i] += e.shard_end - e.shard_begin;
        // The parameter now is its piece of the shard, with the right values.
        EXPECT_EQ(e.param.numel(), e.shard_end - e.shard_begin);
        if (e.param.numel() > 0) {
          const int64_t first = rank * shard_numel + e.shard_begin - e.offset;
          EXPECT_EQ(e.param[0].item<float>(), static_cast<float>(first));
        }
      }
    }
    for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(covered[i], sizes[i]) << "world " << world;
    EXPECT_EQ(shard_numel, (20 + world - 1) / world);
  }
}

TEST(Data, GlobalBatchDoesNotDependOnHowItIsSplit) {
  const auto corpus = gpt::ByteCorpus::load(FSDP_TEST_CORPUS_DIR, 1 << 20, 34);
  auto [all_x, all_y] = corpus.batch(7, 3, 0, 6, 32);
  auto [first_x, first_y] = corpus.batch(7, 3, 0, 2, 32);
  auto [rest_x, rest_y] = corpus.batch(7, 3, 2, 4, 32);
  EXPECT_TRUE(torch::equal(all_x, torch::cat({first_x, rest_x})));
  EXPECT_TRUE(torch::equal(all_y.narrow(1, 0, 31), all_x.narrow(1, 1, 31)));  // next-byte targets
  auto [other_x, other_y] = corpus.batch(7, 4, 0, 6, 32);
  EXPECT_FALSE(torch::equal(all_x, other_x));  // another step, other rows
}

TEST(Data, MissingOrTinyDataIsAClearError) {
  std::string message = error_of([] { gpt::ByteCorpus::load("/no/such/path", 1 << 20, 34); });
  EXPECT_NE(message.find("/no/such/path"), std::string::npos) << message;
  message = error_of([] { gpt::ByteCorpus::load(FSDP_TEST_CORPUS_DIR, 10, 34); });
  EXPECT_NE(message.find("fewer than"), std::string::npos) << message;
}

TEST(Unit, IsAPassThroughUntilSharded) {
  torch::manual_seed(0);
  torch::nn::Linear linear(3, 2);
  fsdp::Unit<torch::nn::Linear> unit(linear);
  auto x = torch::randn({4, 3});
  EXPECT_FALSE(unit.is_sharded());
  EXPECT_TRUE(torch::equal(unit(x), linear(x)));
  EXPECT_TRUE(unit.units().empty());
}

TEST(Gpt, HasGpt2ParameterNamesAndInitialisation) {
  auto model = gpt::make_gpt(gpt::GPTConfig::sized(/*layers=*/2, /*dim=*/32, /*heads=*/4, /*max_seq=*/16), 1);
  auto params = model->named_parameters();
  for (const char* name : {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight",
                           "h.0.attn.c_attn.bias", "h.1.attn.c_proj.weight", "h.1.ln_2.bias",
                           "h.1.mlp.c_fc.weight", "h.1.mlp.c_proj.weight", "ln_f.weight"}) {
    EXPECT_NE(params.find(name), nullptr) << name;
  }
  EXPECT_EQ(params["h.0.attn.c_attn.weight"].sizes(), torch::IntArrayRef({96, 32}));
  EXPECT_EQ(params["h.0.mlp.c_fc.weight"].sizes(), torch::IntArrayRef({128, 32}));
  EXPECT_NEAR(params["wte.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(params["h.0.mlp.c_proj.weight"].std().item<double>(), 0.02 / 2.0, 0.0015);
  EXPECT_EQ(params["h.0.attn.c_attn.bias"].abs().sum().item<double>(), 0.0);
  auto logits = model(torch::zeros({2, 16}, torch::kLong));
  EXPECT_EQ(logits.sizes(), torch::IntArrayRef({2, 16, 256}));
  // Causal: the first position's logits ignore later tokens.
  auto changed = torch::zeros({2, 16}, torch::kLong);
  changed.index_put_({torch::indexing::Slice(), 5}, 7);
  EXPECT_TRUE(torch::allclose(model(changed).select(1, 0), logits.select(1, 0)));
}

gpt::GPTConfig two_block_config() { return gpt::GPTConfig::sized(2, 32, 4, 16); }

// make_gpt draws each parameter from its own stream ([Note: GPT init]): the model is a function
// of (config, seed) alone, whatever the thread count, and same-shaped parameters differ.
TEST(Gpt, InitialisationDependsOnTheSeedNotOnTheThreads) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  auto serial = gpt::make_gpt(two_block_config(), 7)->named_parameters();
  at::set_num_threads(4);
  auto parallel = gpt::make_gpt(two_block_config(), 7)->named_parameters();
  at::set_num_threads(threads);
  auto other_seed = gpt::make_gpt(two_block_config(), 8)->named_parameters();
  for (const auto& item : serial) {
    EXPECT_TRUE(torch::equal(item.value(), parallel[item.key()])) << item.key();
    EXPECT_LT(item.value().abs().max().item<double>(), 1.01) << item.key() << " left uninitialised";
  }
  EXPECT_FALSE(torch::equal(serial["h.0.attn.c_attn.weight"], other_seed["h.0.attn.c_attn.weight"]));
  EXPECT_FALSE(torch::equal(serial["h.0.mlp.c_fc.weight"], serial["h.1.mlp.c_fc.weight"]));
  EXPECT_NE(gpt::parameter_seed(7, "h.0.mlp.c_fc.weight"), gpt::parameter_seed(7, "h.1.mlp.c_fc.weight"));
  EXPECT_NE(gpt::parameter_seed(7, "wte.weight"), gpt::parameter_seed(8, "wte.weight"));
}

TEST(Gpt, AParameterWithANanOrAnInfIsNotFinite) {
  auto model = gpt::make_gpt(two_block_config(), 1);
  EXPECT_TRUE(gpt::parameters_finite(model, nullptr));
  const double bad_values[] = {std::nan(""), INFINITY, -INFINITY};
  for (const double bad : bad_values) {
    auto broken = gpt::make_gpt(two_block_config(), 1);
    torch::NoGradGuard no_grad;
    broken->h[1]->mlp->c_fc->weight.view({-1})[77] = bad;
    EXPECT_FALSE(gpt::parameters_finite(broken, nullptr)) << bad;
  }
}

}  // namespace
