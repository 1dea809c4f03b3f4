#include "plan/bytes_text.h"

#include <cstdio>

namespace fsdp::planning {

std::string bytes_text(double bytes) {
  char text[32];
  if (bytes >= 10.0 * (1 << 30)) {
    std::snprintf(text, sizeof(text), "%.2f GiB", bytes / (1 << 30));
  } else {
    std::snprintf(text, sizeof(text), "%.2f MiB", bytes / (1 << 20));
  }
  return text;
}

}  // namespace fsdp::planning
