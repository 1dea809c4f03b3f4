#pragma once
// Byte counts as gpt_train prints them: "12.3 MiB"; a GiB for flags given in GiB.

#include <cstdint>
#include <cstdio>
#include <string>

namespace gpt {

inline constexpr double kGiB = 1024.0 * 1024 * 1024;

inline std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", bytes / 1048576.0);
  return text;
}

}  // namespace gpt
