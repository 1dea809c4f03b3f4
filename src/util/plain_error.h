#pragma once
// A c10::Error whose what() is its message alone. TORCH_CHECK's what() appends this rank's C++
// backtrace (40 lines), which says nothing about a failure another rank caused, and which a
// program that does not catch the error prints whole (std::terminate prints what()).

#include <c10/util/Exception.h>

#include <string>

namespace fsdp {

/// Throws c10::Error(message) without a backtrace: what() and what_without_backtrace() are both
/// `message`.
[[noreturn]] inline void throw_plain_error(std::string message) {
  throw c10::Error(std::move(message), /*backtrace=*/nullptr);
}

}  // namespace fsdp
