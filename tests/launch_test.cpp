// The launch layer (src/launch) on its own: the launchers' variables (torchrun, Slurm, Open MPI),
// the library's FSDP_* settings, Gloo's address, shard groups across hosts.
#include <fsdp/fsdp.h>

#include "launch/environment_settings.h"
#include "launch/gloo_backend.h"
#include "launch/host_placement.h"

#include <gtest/gtest.h>

#include "error_of.h"

#include <sys/socket.h>

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

TEST(LaunchEnv, NoLaunchersVariableRunsAloneOnAPortTheOsPicks) {
  const auto alone = fsdp::LaunchEnv::from(lookup_in({{"PATH", "/bin"}}));
  EXPECT_EQ(alone.launcher, "none");
  EXPECT_EQ(alone.rank, 0);
  EXPECT_EQ(alone.world_size, 1);
  EXPECT_EQ(alone.local_world_size, 1);
  EXPECT_EQ(alone.master_addr, "127.0.0.1");
  EXPECT_EQ(alone.master_port, 0);  // a fixed port would collide with another program's
}

TEST(LaunchEnv, OnePartOfTheContractStillNamesTheRest) {
  for (const char* name : {"WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK"}) {
    const std::string message = error_of([&] { fsdp::LaunchEnv::from(lookup_in({{name, "1"}})); });
    EXPECT_NE(message.find("RANK"), std::string::npos) << message;
    EXPECT_NE(message.find("MASTER_ADDR"), std::string::npos) << message;
    EXPECT_NE(message.find("one rank"), std::string::npos) << message;
  }
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

}  // namespace
