#pragma once
/// A per-rank timeline of compute and communication spans per unit, as Chrome trace JSON
/// (open it in https://ui.perfetto.dev or chrome://tracing).

#include <string>

namespace fsdp {

/// Starts recording (clears what was recorded before).
void start_trace();
/// Stops recording and writes the spans recorded since start_trace() to `path`.
void write_trace(const std::string& path, int rank);

}  // namespace fsdp
