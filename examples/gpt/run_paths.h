#pragma once
// Every file and folder a gpt_train run reads or writes, checked before any work: inputs exist
// and can be read to an end, outputs can be written, and no output is an input (or inside an
// input folder, or holds one): a run never overwrites what it reads.

#include "options.h"

#include <string>

namespace gpt {

/// `path` with every "{rank}" replaced by `rank` (per-rank outputs: --metrics, --trace).
std::string for_rank(std::string path, int rank);

/// Checks the paths of `o` for this process (`rank` of `world_size`; the reference: 0 of 1).
/// Not a collective: every rank checks its own per-rank outputs and the shared inputs. Throws a
/// message naming the flag, the path, the rule and the fix.
void check_paths(const TrainOptions& o, int rank, int world_size);

}  // namespace gpt
