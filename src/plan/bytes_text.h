#pragma once
// Bytes as the planner's reports print them: MiB below 10 GiB, GiB above.

#include <string>

namespace fsdp::planning {

std::string bytes_text(double bytes);

}  // namespace fsdp::planning
