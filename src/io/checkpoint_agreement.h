#pragma once
// [Note: checkpoint agreement]
// Every phase that can fail on one rank (a full disk, a missing or corrupt file) is local work
// followed by one exchange of error strings over the world group (throw_if_any_failed), so all
// ranks throw the same error together instead of some waiting forever in the next collective.
// Loading stages everything in fresh tensors first and copies into the model and the optimizer
// only after the exchange said every rank succeeded: a bad checkpoint changes nothing.
//
// The exchanges are the world process group's own all-reduces, not the model's collectives:
// agreement among all ranks about the files, which the model's DeviceRuntime does not run.

#include <fsdp/distributed.h>

#include <functional>
#include <string>
#include <vector>

namespace fsdp::detail {

/// Every rank's string, in rank order (a collective over `world`).
std::vector<std::string> all_gather_strings(ProcessGroup& world, const std::string& mine);

/// Throws on every rank, naming the first rank that failed, when any rank's `error` is not empty.
void throw_if_any_failed(ProcessGroup& world, const std::string& error, const std::string& what);

/// Runs `local` and returns its error message ("" on success): the local half of an agreement.
std::string try_local(const std::function<void()>& local);

}  // namespace fsdp::detail
