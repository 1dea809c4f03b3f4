// Asynchronous sharded checkpoints (include/fsdp/async_checkpoint.h): save_checkpoint's phases
// ([Note: a save as a snapshot]) with the snapshot staged in an arena and written by a
// background thread; wait() completes it ([Note: one save at a time]).
#include <fsdp/async_checkpoint.h>

#include "io/async_save.h"
#include "io/pending_save.h"
#include "io/save_snapshot.h"
#include "io/staging_arena.h"
#include "io/step_folders.h"
#include "core/sharded_view.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace fsdp::detail {

struct AsyncSaveState {
  SaveSnapshot snapshot;
  std::string dir;
  std::string name;  // the step folder's
  int keep_last = 0;
  std::unique_ptr<StagingArena> arena;
  std::thread writer;  // writes the last wave; the only thread besides the caller's
  std::atomic<bool> written{false};
  int staged_waves = 0;
  bool reused_arena = false;  // staged in memory made before the save (reserved, or a save's)
  std::string write_error;  // this rank's, once written
  std::mutex completing;    // wait() from two threads completes once
  bool completed = false;
  std::exception_ptr failure;

  ~AsyncSaveState() {
    if (writer.joinable()) writer.join();  // never abandons a write half-way (nor its arena)
  }
};

namespace {

// This process's pending save ([Note: one save at a time]).
std::shared_ptr<AsyncSaveState>& pending_save() {
  static std::shared_ptr<AsyncSaveState> pending;
  return pending;
}

// [Note: the staging arena is kept]
// A fresh arena's pages are faulted in by its first copy: for 150 MB, more time than the copy
// itself, paid on the training thread at every save. So a completed save hands its arena back
// here and the next save of the same budget stages into the same, already mapped, memory: the
// process holds the budget from its first asynchronous save on (what the planner counts,
// docs/planner.md), and a save stalls for the copy alone. Another budget replaces it.
// reserve_staging_arena makes it before the first save and faults its pages on a background
// thread, so that the first save stalls for the copy alone too.
// Never destroyed: at exit, a pinned arena would outlive CUDA's host allocator.
struct KeptArena {
  std::unique_ptr<StagingArena> arena;
  std::thread faulting;  // a reserved arena's pages being faulted in; joined before any use
};

KeptArena& kept() {
  static auto* kept = new KeptArena;
  return *kept;
}

std::unique_ptr<StagingArena> take_kept_arena() {
  if (kept().faulting.joinable()) kept().faulting.join();
  return std::move(kept().arena);
}

bool fits(const std::unique_ptr<StagingArena>& arena, int64_t bytes, bool pinned) {
  return arena && arena->bytes() == bytes && arena->pinned() == pinned;
}

std::unique_ptr<StagingArena> arena_of(int64_t bytes, bool pinned) {
  std::unique_ptr<StagingArena> arena = take_kept_arena();
  if (fits(arena, bytes, pinned)) return arena;
  arena.reset();  // the old one goes before the new one is made: never both
  return std::make_unique<StagingArena>(bytes, pinned);
}

// The arena a save of `files` stages in: the budget, or all the files when they need less
// (or the budget is 0).
int64_t arena_bytes(const std::vector<ShardFileContents>& files, int64_t budget) {
  int64_t needed = 0;
  for (const auto& file : files) needed += staged_bytes(file);
  return budget <= 0 || budget > needed ? needed : budget;
}

// [Note: the writer yields to training]: the writer's CRCs and copies into the page cache (and
// a reserved arena's page faults) take a core; at the lowest priority they run when the ranks
// wait (collectives, I/O), not instead of them.
void lower_this_threads_priority() {
  setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
}

// Joins this rank's write, agrees on every rank's, then metadata.json and `latest` (collectives).
void complete(AsyncSaveState& state) {
  std::lock_guard<std::mutex> lock(state.completing);
  if (!state.completed) {
    state.completed = true;
    if (state.writer.joinable()) state.writer.join();
    state.snapshot.files.clear();  // what a failed write left staged
    kept().arena = std::move(state.arena);  // its copies are written: the next save reuses it
    try {
      complete_snapshot(state.snapshot, state.write_error);
      publish_step_folder(state.snapshot.world, state.dir, state.name, state.keep_last);
    } catch (...) {
      state.failure = std::current_exception();
    }
  }
  if (state.failure) std::rethrow_exception(state.failure);
}

// Stages files [first, last) of the snapshot in the arena and, unless they are the last wave,
// writes them; returns the error that stopped it ("").
std::string stage_wave(AsyncSaveState& state, size_t first, size_t last, bool write) {
  return try_local([&] {
    if (state.arena) state.arena->stage(state.snapshot.files, first, last);
    if (write) write_snapshot(state.snapshot, first, last, {});
  });
}

// Stages the snapshot's files wave by wave: every wave but the last written here (the arena is
// needed again), the last one by the background thread.
void stage_and_start(AsyncSaveState& state, int64_t budget, bool pinned, const SaveHooks& hooks) {
  SaveSnapshot& snapshot = state.snapshot;
  std::vector<std::pair<size_t, size_t>> waves;
  const std::string error = try_local([&] {
    if (!snapshot.writer) return;
    budget = arena_bytes(snapshot.files, budget);
    waves = plan_waves(snapshot.files, budget);
    state.reused_arena = fits(kept().arena, budget, pinned);
    state.arena = arena_of(budget, pinned);
  });
  throw_if_any_failed(snapshot.world, error, "save_checkpoint_async: cannot stage " + snapshot.folder);
  state.staged_waves = static_cast<int>(waves.size());
  if (waves.empty()) waves.emplace_back(0, snapshot.files.size());  // hooks run, as in a synchronous save
  for (size_t w = 0; w < waves.size() && state.write_error.empty(); ++w) {
    state.write_error = stage_wave(state, waves[w].first, waves[w].second, /*write=*/w + 1 < waves.size());
  }
  if (!state.write_error.empty()) {
    snapshot.files.clear();  // the unstaged files are views of the live tensors: never written
    state.written = true;
    return;
  }
  const auto [first, last] = waves.back();
  state.writer = std::thread([&state, first = first, last = last, hooks] {
    lower_this_threads_priority();
    state.write_error = try_local([&] { write_snapshot(state.snapshot, first, last, hooks); });
    state.written = true;
  });
}

}  // namespace

void wait_for_pending_save() {
  std::shared_ptr<AsyncSaveState> pending = std::move(pending_save());
  pending_save() = nullptr;
  if (pending) complete(*pending);
}

AsyncSave start_async_save(const AgreementGroups& world, const std::string& dir, int64_t step,
                           const nlohmann::json& extra, int keep_last, const AsyncSaveOptions& options, bool pinned,
                           const TakeSnapshot& take) {
  wait_for_pending_save();  // [Note: one save at a time]
  auto state = std::make_shared<AsyncSaveState>();
  state->dir = dir;
  state->keep_last = keep_last;
  state->name = unpublished_step_folder(world, dir, step);
  state->snapshot = take(dir + "/" + state->name, extra_with_step(extra, step));
  stage_and_start(*state, options.staging_budget_bytes(), pinned, options.hooks());
  pending_save() = state;
  return AsyncSave(state);
}

}  // namespace fsdp::detail

namespace fsdp {

AsyncSaveOptions& AsyncSaveOptions::staging_budget_bytes(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "AsyncSaveOptions: staging_budget_bytes must be >= 0 (0: one rank's shards), got ",
              bytes);
  staging_budget_bytes_ = bytes;
  return *this;
}

AsyncSaveOptions& AsyncSaveOptions::hooks(SaveHooks hooks) {
  hooks_ = std::move(hooks);
  return *this;
}

AsyncSave::AsyncSave(std::shared_ptr<detail::AsyncSaveState> state) : state_(std::move(state)) {}

void AsyncSave::wait() const {
  // Waited on here: the next save need not complete it (nor throw its error again).
  if (detail::pending_save() == state_) detail::pending_save() = nullptr;
  detail::complete(*state_);
}

bool AsyncSave::done() const { return state_->written.load(); }

int AsyncSave::staged_waves() const { return state_->staged_waves; }

bool AsyncSave::reused_arena() const { return state_->reused_arena; }

const std::string& AsyncSave::folder() const { return state_->snapshot.folder; }

void reserve_staging_arena(const ShardedModel& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                           const AsyncSaveOptions& options) {
  using namespace detail;
  reserve_arena_for(local_shard_files(model, optimizers), ShardedView(model).compute_device().is_cuda(), options);
}

}  // namespace fsdp

namespace fsdp::detail {

void reserve_arena_for(const std::vector<ShardFileContents>& files, bool pinned, const AsyncSaveOptions& options) {
  const int64_t bytes = arena_bytes(files, options.staging_budget_bytes());
  // A pending save's arena is kept when it completes; the kept one may fit already.
  if (bytes == 0 || pending_save() || fits(kept().arena, bytes, pinned)) return;
  auto arena = arena_of(bytes, pinned);
  kept().faulting = std::thread([raw = arena.get()] {
    lower_this_threads_priority();
    raw->fault_in();
  });
  kept().arena = std::move(arena);
}

}  // namespace fsdp::detail

namespace fsdp {

void reserve_staging_arena(const ShardedModel& model, torch::optim::Optimizer& optimizer,
                           const AsyncSaveOptions& options) {
  reserve_staging_arena(model, std::vector<torch::optim::Optimizer*>{&optimizer}, options);
}

AsyncSave save_checkpoint_async(const ShardedModel& model, torch::optim::Optimizer& optimizer, const std::string& dir,
                                int64_t step, const nlohmann::json& extra, int keep_last,
                                const AsyncSaveOptions& options) {
  return save_checkpoint_async(model, std::vector<torch::optim::Optimizer*>{&optimizer}, dir, step, extra,
                               keep_last, options);
}

AsyncSave save_checkpoint_async(const ShardedModel& model, const std::vector<torch::optim::Optimizer*>& optimizers,
                                const std::string& dir, int64_t step, const nlohmann::json& extra, int keep_last,
                                const AsyncSaveOptions& options) {
  using namespace detail;
  const ShardedView view(model);
  return start_async_save(agreement_groups(view), dir, step, extra, keep_last, options,
                          view.compute_device().is_cuda(),
                          [&](const std::string& folder, const nlohmann::json& extra_and_step) {
                            return take_snapshot(model, optimizers, folder, extra_and_step);
                          });
}

}  // namespace fsdp
