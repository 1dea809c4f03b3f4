#pragma once
// The message an action throws ("" when it throws nothing), without LibTorch's backtrace.

#include <c10/util/Exception.h>

#include <exception>
#include <functional>
#include <string>

namespace fsdp_test {

inline std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace fsdp_test
