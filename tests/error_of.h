#pragma once
// The message an action throws ("" when it throws nothing), without LibTorch's backtrace.

#include <fsdp/error_text.h>

#include <exception>
#include <functional>
#include <string>

namespace fsdp_test {

inline std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::exception& e) {
    return fsdp::message_of(e);
  }
  return "";
}

}  // namespace fsdp_test
