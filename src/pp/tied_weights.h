#pragma once
// Tied weights across stages ([Note: tied weights across stages]): found from the model (a tensor
// registered under two names held by different stages), made equal over the pp ranks holding
// them, their gradients summed over those ranks after each step; a sharded stage's copy is whole
// only over its shard group ([Note: a tie across sharded stages]).

#include <fsdp/distributed.h>
#include <fsdp/pipeline.h>
#include <fsdp/sharded_model.h>

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

namespace fsdp::pp {

/// A parameter of the model under one of its names, and the stage whose part holds that name.
struct ParameterPlace {
  std::string name;
  at::Tensor tensor;
  int stage;
};

/// The parameters of stage `index` that are the same tensor as a parameter of another stage.
std::vector<TiedParameter> ties_of_stage(const std::vector<ParameterPlace>& places, int index);

/// This rank's tied tensors that other pp ranks hold too, and what the pipeline does with them.
class TiedWeights {
 public:
  /// `rank_of`: the pp rank of each stage.
  TiedWeights(const std::vector<Stage>& local_stages, const std::vector<int>& rank_of, int rank);

  /// Every holder gets the values of the tensor's first holding stage (the model may have been
  /// built from another seed on each rank).
  void make_equal(ProcessGroup& pp);
  /// Before a step: takes each tie's gradient away (kept), so that the step's backward computes
  /// this step's alone ([Note: a tied weight's gradient accumulated over steps]); a sharded
  /// stage's stays in its gradient shard, a copy kept, the step's own the difference.
  void set_aside_gradients();
  /// Each holder's gradient becomes the sum of every holder's for this step, added in pp rank
  /// order (so the sums, and the values after the optimizer step, are bitwise equal on every
  /// holder), added to the gradient set aside before the step.
  void sum_gradients(ProcessGroup& pp);

 private:
  struct Tie {
    std::string name;        // the tensor's first name in the model
    at::Tensor tensor;       // this rank's copy (a sharded stage's: its piece)
    std::vector<int> ranks;  // the pp ranks holding it, increasing (this one included)
    std::string stage_name;               // the holding stage's name for it
    std::optional<ShardedModel> sharded;  // the holding stage's, when it is sharded
  };
  // The whole tensor of which `local` is this rank's copy or piece (a collective over a sharded
  // stage's shard group), and `whole`'s piece written back into `local`.
  static at::Tensor whole_of(const Tie& tie, const at::Tensor& local);
  static void write_piece(const Tie& tie, const at::Tensor& whole, const at::Tensor& local);
  // The ties this rank shares with `peer`, in the same order on both ranks (their tags).
  std::vector<const Tie*> shared_with(int peer) const;
  int tag_of(const Tie& tie, int peer) const;

  at::Tensor kept_of(size_t tie) const;  // set aside before this step, or undefined

  int rank_;
  std::vector<Tie> ties_;  // ordered by name
  std::vector<at::Tensor> kept_;  // each tie's gradient from the steps before this one (set aside)
};

}  // namespace fsdp::pp
