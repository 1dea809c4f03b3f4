#include "core/unit_collectives.h"

#include "comm/publishing_collectives.h"
#include "device/device.h"
#include "util/copy_bytes.h"
#include "util/trace.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <mutex>
#include <utility>
#include <vector>

namespace fsdp {

namespace {

// Submits gather_unit on the all-gather lane, into a freshly allocated unsharded buffer.
class PlainGather final : public UnitGather {
 public:
  PlainGather(DeviceRuntime& device, Collectives& shard_group) : device_(device), shard_group_(shard_group) {}

  CommHandle issue(FlatParam& flat, const std::string& label) override {
    flat.allocate_full();
    if (!flat.sharded() && !flat.offloaded()) {
      // A shard group of one rank (W = 1) only casts its shard for compute: on the compute
      // stream, in order. On a lane's high-priority stream the cast would overlap GEMMs and slow
      // them (measured on an H200: 2.5x the cast's own time), with no communication to hide.
      at::NoGradGuard no_grad;
      gather_unit(flat, shard_group_);
      return CommHandle();
    }
    return device_.submit(
        CommLane::AllGather,
        [&shard_group = shard_group_, &flat, &label] {
          TraceSpan trace("all_gather", label, TraceLane::Communication);
          gather_unit(flat, shard_group);
        },
        flat.full().nbytes());
  }

 private:
  DeviceRuntime& device_;
  Collectives& shard_group_;
};

// Submits `sum` (the reduction of `flat`'s gradient) on the reduce lane; the unsharded gradient's
// bytes are released once the collective that read them has completed.
template <class Sum>
CommHandle submit_reduction(DeviceRuntime& device, FlatParam& flat, const std::string& label,
                            std::shared_ptr<ReductionEnd> end, Sum sum) {
  return device.submit(
      CommLane::Reduce,
      [&device, &flat, &label, end = std::move(end), sum = std::move(sum)] {
        TraceSpan trace("reduce_scatter", label, TraceLane::Communication);
        at::NoGradGuard no_grad;
        sum();
        device.release_after(CommLane::Reduce, flat.take_full_grad_bytes());
      },
      flat.full_grad().nbytes());
}

// Submits reduce_unit_gradient on the reduce lane.
class PlainReduce final : public UnitReduce {
 public:
  PlainReduce(DeviceRuntime& device, Collectives& shard_group, Collectives* replicas)
      : device_(device), shard_group_(shard_group), replicas_(replicas) {}

  CommHandle issue(FlatParam& flat, const ReducePlan& plan, std::shared_ptr<ReductionEnd> end,
                   const std::string& label) override {
    return submit_reduction(device_, flat, label, std::move(end), [this, &flat, plan] {
      reduce_unit_gradient(flat, plan, shard_group_, replicas_);
    });
  }

 private:
  DeviceRuntime& device_;
  Collectives& shard_group_;
  Collectives* replicas_;
};

class PlainCollectives : public UnitCollectives {
 public:
  PlainCollectives(DeviceRuntime& device, Collectives& shard_group, Collectives* replicas)
      : plain_gather_(std::make_shared<PlainGather>(device, shard_group)),
        plain_reduce_(std::make_shared<PlainReduce>(device, shard_group, replicas)) {}

  std::shared_ptr<UnitGather> gather(FlatParam&, std::function<bool()>, std::function<void()>) override {
    return plain_gather_;
  }
  std::shared_ptr<UnitReduce> reduce(const FlatParam&) override { return plain_reduce_; }

 protected:
  std::shared_ptr<PlainGather> plain_gather_;
  std::shared_ptr<PlainReduce> plain_reduce_;
};

// [Note: gathering from the board]
// The board's gathers ([Note: decoupled collectives] in shm_collectives.cpp) read the shards as
// they were published when the root's forward started. So they gather from the board only while
// the root's forward or a backward runs (the window), and only while no between-steps entry
// point (a state dict, a checkpoint, summoning) has run since the publication and no backward
// has ended (the optimizer steps next); a unit gathered outside (called alone) gathers in
// rounds. A unit whose parameters only the pass sees (resharded after its forward and its
// backward) computes on the board's bytes, lent to its unsharded buffer; one whose unsharded
// parameters the program sees between passes (the root, a unit kept unsharded after forward)
// gets a copy of its own, so that an in-place edit of them stays this rank's, as with any
// all-gather. Before the next publication, a flat group still holding lent bytes (a forward that
// failed left it unsharded) is resharded: the peers overwrite them next; a backward that comes
// later gathers it again.
class Publication {
 public:
  explicit Publication(PublishingCollectives& board) : board_(board) {}

  /// Publishes `shards` for the pass that starts; opens the window.
  void publish(const std::vector<at::Tensor>& shards) {
    current_ = board_.publish_shards(shards);
    window_open_ = true;
  }
  void set_window(bool open) { window_open_ = open; }
  /// Something may write the shards: the publication is out of date until the next.
  void outdate() { current_ = false; }
  /// Whether gathers read the board now.
  bool readable() const { return window_open_ && current_; }
  /// Shard `index`'s unsharded buffer on the board; nullptr where the board has none.
  void* unsharded(size_t index) { return board_.published_unsharded(index); }

 private:
  PublishingCollectives& board_;
  bool window_open_ = false;
  bool current_ = false;  // published, and no shard written since
};

// A flat group whose unsharded buffer is its shards side by side on the host: borrowed or copied
// from the board while the publication is readable, else gathered plainly.
class BoardGather final : public UnitGather {
 public:
  BoardGather(Publication& publication, PlainGather& plain, DeviceRuntime& device, FlatParam& flat,
              std::function<bool()> pass_only, std::function<void()> give_back)
      : publication_(publication),
        plain_(plain),
        device_(device),
        flat_(flat),
        pass_only_(std::move(pass_only)),
        give_back_(std::move(give_back)) {}

  /// Before a publication: gives back bytes borrowed from the last one.
  void give_back_borrowed() {
    if (flat_.full_lent()) give_back_();
  }
  /// Takes its place among the shards to publish, and decides whether it borrows.
  void take_place(std::vector<at::Tensor>& shards) {
    index_ = shards.size();
    shards.push_back(flat_.shard());
    borrows_ = pass_only_();
  }

  CommHandle issue(FlatParam& flat, const std::string& label) override {
    TORCH_INTERNAL_ASSERT(&flat == &flat_, "a board gather serves one flat group");
    if (!publication_.readable()) return plain_.issue(flat, label);
    TraceSpan trace("all_gather", label, TraceLane::Communication);
    void* board = publication_.unsharded(index_);
    if (board == nullptr) return plain_.issue(flat, label);
    const size_t nbytes = static_cast<size_t>(flat.full().numel()) * flat.full().element_size();
    if (borrows_) {
      flat.use_lent_full(device_.lent_bytes(board, nbytes));
    } else {
      flat.allocate_full();
      copy_bytes(flat.full().data_ptr(), board, nbytes);
    }
    return CommHandle();
  }

 private:
  Publication& publication_;
  PlainGather& plain_;
  DeviceRuntime& device_;
  FlatParam& flat_;
  std::function<bool()> pass_only_;
  std::function<void()> give_back_;
  size_t index_ = 0;      // its shard's place among the published ones
  bool borrows_ = false;  // computes on the board's bytes rather than a copy of them
};

// A reduction whose sum may complete after its task (reduce_scatter_sum_posted): waiting on it
// waits for the task, then runs the completion the task left behind, once.
class PostedReduction final : public CommHandle::Completion {
 public:
  using Slot = std::shared_ptr<std::function<void()>>;
  PostedReduction(CommHandle task, Slot completion) : task_(std::move(task)), completion_(std::move(completion)) {}
  void wait() override {
    task_.wait();
    complete();
  }
  void wait_host() override {
    task_.wait_host();
    complete();
  }

 private:
  void complete() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!*completion_) return;
    (*completion_)();
    *completion_ = nullptr;
  }

  CommHandle task_;
  Slot completion_;  // set by the task (the wait on it orders the read after)
  std::mutex mutex_;
};

// A reduction without replicas whose sum goes straight into the gradient shard is posted: its
// sum and the division for the mean come when the shard is needed, in one pass over it.
class PostedReduce final : public UnitReduce {
 public:
  PostedReduce(DeviceRuntime& device, Collectives& shard_group, PublishingCollectives& board)
      : device_(device), shard_group_(shard_group), board_(board) {}

  CommHandle issue(FlatParam& flat, const ReducePlan& plan, std::shared_ptr<ReductionEnd> end,
                   const std::string& label) override {
    auto completion = std::make_shared<std::function<void()>>();
    CommHandle task = submit_reduction(device_, flat, label, std::move(end), [this, &flat, plan, completion] {
      *completion = post(flat, plan);
    });
    return CommHandle(std::make_shared<PostedReduction>(std::move(task), std::move(completion)));
  }

 private:
  std::function<void()> post(FlatParam& flat, const ReducePlan& plan) {
    if (!reduces_into_shard(flat, plan)) {
      reduce_unit_gradient(flat, plan, shard_group_, /*replicas=*/nullptr);
      return {};
    }
    return board_.reduce_scatter_sum_posted(flat.grad_shard(), gradient_to_scatter(flat, plan), plan.post);
  }

  DeviceRuntime& device_;
  Collectives& shard_group_;
  PublishingCollectives& board_;
};

// The units' collectives where the model's shard group publishes.
class BoardCollectives final : public PlainCollectives {
 public:
  BoardCollectives(DeviceRuntime& device, Collectives& shard_group, Collectives* replicas,
                   PublishingCollectives& board)
      : PlainCollectives(device, shard_group, replicas),
        device_(device),
        board_(board),
        publication_(board),
        posted_reduce_(replicas ? nullptr : std::make_shared<PostedReduce>(device, shard_group, board)) {}

  std::shared_ptr<UnitGather> gather(FlatParam& flat, std::function<bool()> pass_only,
                                     std::function<void()> give_back) override {
    if (!unsharded_is_host_shards(flat)) return plain_gather_;
    auto gather = std::make_shared<BoardGather>(publication_, *plain_gather_, device_, flat,
                                                std::move(pass_only), std::move(give_back));
    board_gathers_.push_back(gather);
    return gather;
  }
  std::shared_ptr<UnitReduce> reduce(const FlatParam&) override {
    if (posted_reduce_) return posted_reduce_;
    return plain_reduce_;
  }

  void step_begins() override {
    for (auto& gather : board_gathers_) gather->give_back_borrowed();  // the peers overwrite them
    std::vector<at::Tensor> shards;
    for (auto& gather : board_gathers_) gather->take_place(shards);
    publication_.publish(shards);
  }
  void forward_ends() override { publication_.set_window(false); }
  void backward_begins() override { publication_.set_window(true); }
  void shards_may_change() override { publication_.outdate(); }
  void backward_ends() override {
    publication_.outdate();
    publication_.set_window(false);
    board_.complete_posted();
  }

 private:
  DeviceRuntime& device_;
  PublishingCollectives& board_;
  Publication publication_;
  std::shared_ptr<PostedReduce> posted_reduce_;  // null with replicas: their all-reduce follows the sum
  std::vector<std::shared_ptr<BoardGather>> board_gathers_;  // in the order they were built: every rank's
};

}  // namespace

std::unique_ptr<UnitCollectives> make_unit_collectives(DeviceRuntime& device, Collectives& shard_group,
                                                       Collectives* replicas) {
  if (PublishingCollectives* board = publishing_side(shard_group)) {
    return std::make_unique<BoardCollectives>(device, shard_group, replicas, *board);
  }
  return std::make_unique<PlainCollectives>(device, shard_group, replicas);
}

}  // namespace fsdp
