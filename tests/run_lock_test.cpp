// fsdp::RunLock ([Note: run lock]): one run per checkpoint folder.
#include <fsdp/run_lock.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "error_of.h"

#include "temp_dir.h"
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>

namespace {

namespace fs = std::filesystem;

using fsdp_test::error_of;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string host() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// A pid that existed a moment ago and does not now.
long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

}  // namespace

TEST(RunLock, ASecondLockOnTheFolderIsRefusedNamingTheHolder) {
  fsdp_test::TempDir tmp;
  const std::string folder = tmp.path() + "/ck";  // created by the lock
  fsdp::RunLock first(folder);
  EXPECT_TRUE(fs::is_directory(folder));
  const auto holder = nlohmann::json::parse(read_text(first.path()));
  EXPECT_EQ(holder.at("pid").get<long>(), static_cast<long>(::getpid()));
  EXPECT_EQ(holder.at("host").get<std::string>(), host());
  const std::string error = error_of([&] { fsdp::RunLock second(folder); });
  EXPECT_NE(error.find("is in use by another run"), std::string::npos) << error;
  EXPECT_NE(error.find("pid " + std::to_string(::getpid())), std::string::npos) << error;
  EXPECT_NE(error.find(folder + "/run.lock"), std::string::npos) << error;
}

TEST(RunLock, AReleasedLockIsFreeAndEmpty) {
  fsdp_test::TempDir tmp;
  { fsdp::RunLock first(tmp.path()); }
  EXPECT_EQ(read_text(tmp.path() + "/run.lock"), "");  // a clean end names nobody
  fsdp::RunLock again(tmp.path());
  EXPECT_EQ(again.taken_over_from(), "");
}

TEST(RunLock, TheLockOfADeadRunIsTakenOverNamingIt) {
  fsdp_test::TempDir tmp;
  const long pid = dead_pid();
  std::ofstream(tmp.path() + "/run.lock")
      << nlohmann::json{{"host", host()}, {"pid", pid}, {"pid_start", 1}, {"started", "then"}}.dump();
  fsdp::RunLock lock(tmp.path());
  EXPECT_EQ(lock.taken_over_from(), "host " + host() + ", pid " + std::to_string(pid) +
                                        ", started then");
  EXPECT_EQ(nlohmann::json::parse(read_text(lock.path())).at("pid").get<long>(),
            static_cast<long>(::getpid()));
}

// A file system whose flock does nothing would grant the lock while its holder lives: on this
// host the holder's pid and start time still tell.
TEST(RunLock, AHolderAliveOnThisHostIsRefusedEvenWhenItsFlockIsFree) {
  fsdp_test::TempDir tmp;
  std::string line;
  {
    fsdp::RunLock mine(tmp.path());
    line = read_text(mine.path());
  }
  std::ofstream(tmp.path() + "/run.lock") << line;  // this process's line, its flock released
  const std::string error = error_of([&] { fsdp::RunLock again(tmp.path()); });
  EXPECT_NE(error.find("is in use by another run"), std::string::npos) << error;
  EXPECT_NE(error.find("flock"), std::string::npos) << error;
}

// A holder on another host is judged by its flock alone: a pid there says nothing here.
TEST(RunLock, AHolderOnAnotherHostIsTakenOverWhenItsFlockIsFree) {
  fsdp_test::TempDir tmp;
  std::ofstream(tmp.path() + "/run.lock")
      << nlohmann::json{{"host", host() + "-other"}, {"pid", static_cast<long>(::getpid())},
                        {"pid_start", 0}, {"started", "then"}}
             .dump();
  fsdp::RunLock lock(tmp.path());
  EXPECT_NE(lock.taken_over_from().find(host() + "-other"), std::string::npos);
}

TEST(RunLock, ASymbolicLinkAsTheLockFileIsRefused) {
  fsdp_test::TempDir tmp;
  std::ofstream(tmp.path() + "/elsewhere") << "";
  fs::create_symlink(tmp.path() + "/elsewhere", tmp.path() + "/run.lock");
  const std::string error = error_of([&] { fsdp::RunLock lock(tmp.path()); });
  EXPECT_NE(error.find("symbolic link"), std::string::npos) << error;
}

// A second name of the lock file is another file's content too (a data file linked there, the
// run.lock of a `cp -al` snapshot's original): refused before a byte is written, naming the link.
TEST(RunLock, ALockFileWithAHardLinkIsRefusedAndLeftUnchanged) {
  fsdp_test::TempDir tmp;
  std::ofstream(tmp.path() + "/data.txt") << "the data";
  fs::create_hard_link(tmp.path() + "/data.txt", tmp.path() + "/run.lock");
  const std::string error = error_of([&] { fsdp::RunLock lock(tmp.path()); });
  EXPECT_NE(error.find("hard link"), std::string::npos) << error;
  EXPECT_NE(error.find("cp -al"), std::string::npos) << error;
  EXPECT_EQ(error.find("in use"), std::string::npos) << error;
  EXPECT_EQ(read_text(tmp.path() + "/data.txt"), "the data");
}

// pid_start -1 is what a pid that names no process has: a line with both is no live holder.
TEST(RunLock, AHolderLineWithAnImpossiblePidIsStale) {
  for (const long long pid : {-1LL, 0LL, 1LL << 40}) {
    fsdp_test::TempDir tmp;
    std::ofstream(tmp.path() + "/run.lock")
        << nlohmann::json{{"host", host()}, {"pid", pid}, {"pid_start", -1}, {"started", "then"}}.dump();
    fsdp::RunLock lock(tmp.path());
    EXPECT_NE(lock.taken_over_from().find("pid " + std::to_string(pid)), std::string::npos)
        << lock.taken_over_from();
  }
}

// What the file holds is echoed escaped and cut: a line cannot split a message or drive a terminal.
TEST(RunLock, AHolderLineIsEchoedEscapedAndCut) {
  fsdp_test::TempDir tmp;
  std::ofstream(tmp.path() + "/run.lock")
      << nlohmann::json{{"host", "evil\x1b[2J\nhost" + std::string(3000, 'h')}, {"pid", dead_pid()},
                        {"pid_start", 1}, {"started", "then"}}.dump();
  fsdp::RunLock lock(tmp.path());
  const std::string& shown = lock.taken_over_from();
  EXPECT_NE(shown.find("evil\\x1b[2J\\x0ahost"), std::string::npos) << shown;
  EXPECT_EQ(shown.find('\n'), std::string::npos);
  EXPECT_LT(shown.size(), 600u);
}
