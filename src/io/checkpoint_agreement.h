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

//
// Under tensor parallelism the model's group holds one tensor-parallel index only (FSDP shards
// each tp rank's part over the dp ranks); an agreement spans both: the strings gathered over
// the model's group, then those lists over the tensor-parallel group (AgreementGroups).

#include <fsdp/distributed.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::tp {
class TensorParallel;
}

namespace fsdp::detail {

class ShardedView;

/// Every rank a checkpoint's agreements span: the model's (FSDP's) group and, under tensor
/// parallelism, the tensor-parallel group across it. Ranks are numbered as the device mesh does
/// (dp-major: world rank * tp size + tp rank).
struct AgreementGroups {
  ProcessGroup* world = nullptr;                // the model's ranks (one tp index)
  std::shared_ptr<tp::TensorParallel> tp;       // null without tensor parallelism
  int tp_rank() const;
  int tp_size() const;
  int rank() const { return world->rank() * tp_size() + tp_rank(); }
  int size() const { return world->size() * tp_size(); }
};

/// The model's groups: its world, and the tensor-parallel group its parameters' placements name
/// (include/fsdp/parallelize.h). Throws when they name two.
AgreementGroups agreement_groups(const ShardedView& model);

/// Every rank's string, in rank order (a collective over both groups).
std::vector<std::string> all_gather_strings(const AgreementGroups& groups, const std::string& mine);

/// throw_if_any_failed over both groups.
void throw_if_any_failed(const AgreementGroups& groups, const std::string& error, const std::string& what);

/// Every rank's string, in rank order (a collective over `world`).
std::vector<std::string> all_gather_strings(ProcessGroup& world, const std::string& mine);

/// Throws on every rank, naming the first rank that failed, when any rank's `error` is not empty.
void throw_if_any_failed(ProcessGroup& world, const std::string& error, const std::string& what);

/// Runs `local` and returns its error message ("" on success): the local half of an agreement.
std::string try_local(const std::function<void()>& local);

}  // namespace fsdp::detail
