// Files read from folders (fsdp/file_checks.h): names that stay inside their folder, and files that
// are refused before any read (too large, or not a regular file).
#include <fsdp/file_checks.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "temp_dir.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <sys/stat.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;

using fsdp_test::TempDir;

void expect_error(const std::function<void()>& call, const std::vector<std::string>& parts) {
  try {
    call();
    ADD_FAILURE() << "no error, expected one naming: " << parts.front();
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

TEST(FileChecks, NamesMustStayInsideTheirFolder) {
  TempDir tmp;
  fs::create_directories(tmp / "ckpt/sub");
  fs::create_directories(tmp / "outside");
  fs::create_directory_symlink(tmp / "outside", tmp / "ckpt/out");
  fs::create_directory_symlink("sub", tmp / "ckpt/in");
  const std::string source = tmp / "ckpt/metadata.json";

  fsdp::check_name_inside(tmp / "ckpt", "shard.safetensors", source);
  fsdp::check_name_inside(tmp / "ckpt", "sub/shard.safetensors", source);
  fsdp::check_name_inside(tmp / "ckpt", "in/shard.safetensors", source);  // a link inside
  expect_error([&] { fsdp::check_name_inside(tmp / "ckpt", "../outside/x", source); },
               {source, "'../outside/x'", "'..' component"});
  expect_error([&] { fsdp::check_name_inside(tmp / "ckpt", "sub/../../x", source); },
               {"'..' component"});
  expect_error([&] { fsdp::check_name_inside(tmp / "ckpt", tmp / "outside/x", source); },
               {"absolute path"});
  expect_error([&] { fsdp::check_name_inside(tmp / "ckpt", "", source); }, {"empty"});
  expect_error([&] { fsdp::check_name_inside(tmp / "ckpt", "out/x", source); },
               {source, "'out/x'", "link leads out of"});
  fsdp::check_relative_name("out/x", source);  // links are not followed
}

TEST(FileChecks, FilesTooLargeOrNotRegularAreRefusedUnread) {
  TempDir tmp;
  std::ofstream(tmp / "small.json") << "{}";
  const std::vector<char> small = fsdp::read_regular_file(tmp / "small.json", 2, "a test file");
  EXPECT_EQ(std::string(small.begin(), small.end()), "{}");
  expect_error([&] { fsdp::read_regular_file(tmp / "small.json", 1, "a test file"); },
               {"small.json", "2 bytes, more than the 1", "a test file"});
  ASSERT_EQ(::mkfifo((tmp / "fifo").c_str(), 0600), 0);
  expect_error([&] { fsdp::read_regular_file(tmp / "fifo", 100, "a test file"); },
               {"fifo", "is a FIFO", "a test file must be a regular file"});
  expect_error([&] { fsdp::read_regular_file(tmp / ".", 100, "a test file"); }, {"is a folder"});
  expect_error([&] { fsdp::read_regular_file(tmp / "missing", 100, "a test file"); },
               {"missing", "No such file"});
}

}  // namespace
