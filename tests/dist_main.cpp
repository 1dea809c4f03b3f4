#include "dist_env.h"

#include <gtest/gtest.h>

#include <iostream>

namespace fsdp_test {

namespace {
std::shared_ptr<fsdp::Distributed> g_dist;
}

fsdp::Distributed& dist() { return *g_dist; }

std::string corpus_dir() { return FSDP_TEST_CORPUS_DIR; }

}  // namespace fsdp_test

int main(int argc, char** argv) {
  fsdp::install_memory_counter();  // the tests measure exact tensor bytes
  ::testing::InitGoogleTest(&argc, argv);
  try {
    fsdp_test::g_dist = fsdp::init_distributed();
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << std::endl;
    return 1;
  }
  return RUN_ALL_TESTS();
}
