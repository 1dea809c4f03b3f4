#pragma once
/// Asynchronous sharded checkpoints: save_checkpoint's folder, written while training goes on.
///
/// At the step boundary, on the caller's thread, every rank agrees on the save (the checks and
/// collectives of save_checkpoint) and copies what it writes (its pieces of the parameters and of
/// the optimizer's state, rank 0 the buffers, the steps and param groups' options) into a staging
/// arena of host memory (pinned when the model is on CUDA). Then a background thread writes the
/// shard files from that copy, one file open at a time, each to a temporary name, fsynced and
/// renamed, as the synchronous save does (the same code). Training may change the parameters at
/// once: the checkpoint holds the step's values, never later ones.
///
/// wait() completes the save: a collective (every rank calls it, between steps) that agrees on
/// every rank's write, then writes metadata.json and publishes `latest`, as save_checkpoint does.
/// Until then the new folder is incomplete (no metadata.json) and `latest` names the previous
/// checkpoint: a kill -9 at any moment leaves the previous checkpoint loadable, and the new one
/// appears whole or not at all. The next save (save_checkpoint_async, save_checkpoint or
/// save_sharded) waits for the previous one first (calls its wait()).
///
/// The staging budget: the arena's size. By default one rank's shards (what this rank writes);
/// a smaller budget stages in waves of whole shard files, each written before the next is
/// staged (the caller waits for all but the last), never using more memory than the budget.
/// The arena is kept after wait() for the next save of the same budget (a fresh one's page
/// faults cost more than the copy): the process holds the budget from its first asynchronous
/// save on. The writer thread runs at the lowest CPU priority (nice 19).
///
/// Example:
///   std::optional<fsdp::AsyncSave> saving;
///   for (int64_t step = 0; step < steps; ++step) {
///     train_step(model, optim, step);
///     if ((step + 1) % 100 == 0) {
///       saving = fsdp::save_checkpoint_async(model, optim, "ckpt", step + 1);  // waits for the last
///     }
///   }
///   if (saving) saving->wait();  // throws, on every rank, if any rank could not write

#include <fsdp/checkpoint.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

struct AsyncSaveOptions {
  /// Bytes of host memory the staging arena may take on each rank; 0 (the default): what this
  /// rank's shard files hold, staged at once. Less stages in waves of whole files (a file larger
  /// than the budget is refused, naming both sizes).
  AsyncSaveOptions& staging_budget_bytes(int64_t bytes);
  int64_t staging_budget_bytes() const { return staging_budget_bytes_; }
  /// Test seam: SaveHooks::after_shard_files runs on the background thread.
  AsyncSaveOptions& hooks(SaveHooks hooks);
  const SaveHooks& hooks() const { return hooks_; }

 private:
  int64_t staging_budget_bytes_ = 0;
  SaveHooks hooks_;
};

namespace detail {
struct AsyncSaveState;
}

/// The handle of one asynchronous save. Copies share the save.
class AsyncSave {
 public:
  explicit AsyncSave(std::shared_ptr<detail::AsyncSaveState> state);
  /// Waits for this rank's files, then completes the save (a collective: every rank calls it):
  /// metadata.json and `latest`. Throws on every rank, naming the folder, if any rank could not
  /// write; later calls return at once (or throw the same error again).
  void wait() const;
  /// Whether this rank's background write has finished (not a collective; wait() still
  /// publishes the checkpoint).
  bool done() const;
  /// How many waves this rank staged its shard files in (1 when the budget holds them all; 0
  /// for a rank that writes none): a budget's cost in stalls.
  int staged_waves() const;
  /// Whether this rank staged into an arena made before the save (by reserve_staging_arena or
  /// an earlier save of the same budget), so that the save stalled for the copy alone; false
  /// for the first save without a reservation, or one whose reservation did not fit (made
  /// before the optimizer had its state, or for another budget).
  bool reused_arena() const;
  /// The step folder being written.
  const std::string& folder() const;

 private:
  std::shared_ptr<detail::AsyncSaveState> state_;
};

/// save_checkpoint's folder `dir`/step-NNNNNNNN, written in the background (see above); a
/// collective. Throws at once (every rank) for what the synchronous save refuses before writing
/// (a bad step or extra, a published step saved again, an optimizer outside the model, a folder
/// that cannot be created, a budget below one shard file); errors of the write itself come from
/// wait(). keep_last: as save_checkpoint's, applied when wait() publishes.
///
/// Example:
///   auto saving = fsdp::save_checkpoint_async(model, optim, "ckpt", step, {}, 2,
///                                             fsdp::AsyncSaveOptions().staging_budget_bytes(1 << 30));
AsyncSave save_checkpoint_async(const ShardedModel& model, torch::optim::Optimizer& optimizer, const std::string& dir,
                                int64_t step, const nlohmann::json& extra = nlohmann::json::object(),
                                int keep_last = 0, const AsyncSaveOptions& options = {});
/// The same for several optimizers over one model (save_checkpoint's).
AsyncSave save_checkpoint_async(const ShardedModel& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                                const std::string& dir, int64_t step,
                                const nlohmann::json& extra = nlohmann::json::object(), int keep_last = 0,
                                const AsyncSaveOptions& options = {});

/// Makes the staging arena the next save_checkpoint_async(model, optimizers, ..., options) stages
/// in, now, and faults its pages in on a background thread at the lowest CPU priority: the first
/// asynchronous save then stalls for the copy alone, as later ones do ([Note: the staging arena
/// is kept], src/io/async_checkpoint.cpp). Not a collective. Call it once the optimizers hold
/// their state (after the first step: torch::optim makes it then), with the options of the
/// saves; the process holds the arena from then on, as it would from its first save. Does
/// nothing while a save is pending (its arena is kept when it completes) or when the kept
/// arena fits already. AsyncSave::reused_arena() tells whether a save used it.
///
/// Example:
///   train_step(model, optim, 0);
///   fsdp::reserve_staging_arena(model, optim);  // the first save at step 100 will not fault it in
void reserve_staging_arena(const ShardedModel& model, torch::optim::Optimizer& optimizer,
                           const AsyncSaveOptions& options = {});
void reserve_staging_arena(const ShardedModel& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                           const AsyncSaveOptions& options = {});

}  // namespace fsdp
