#pragma once
// The messages between consecutive stages in one step: an activation from stage s to s+1, a
// gradient from s+1 to s, each under its own tag. Between stages on two ranks they are
// send/recv (activation_channel); between two stages on the same rank (V placement's turn at
// stages P-1 and P, or P = 1) the tensor is handed over in memory and no byte moves.

#include "comm/point_to_point.h"

#include <ATen/core/Tensor.h>

#include <map>
#include <vector>

namespace fsdp::pp {

class StageMessages {
 public:
  /// `rank_of`: the pp rank of each stage; `microbatches`: the step's count (tags are per
  /// boundary and micro-batch).
  StageMessages(ProcessGroup& pp, std::vector<int> rank_of, int microbatches);

  void send_activation(int from_stage, int microbatch, const at::Tensor& t);
  at::Tensor recv_activation(int to_stage, int microbatch);
  void send_gradient(int from_stage, int microbatch, const at::Tensor& t);
  at::Tensor recv_gradient(int to_stage, int microbatch);
  /// Every send has left (a lost peer is named); every local hand-off was taken.
  void finish();

 private:
  void send(int to_stage, int tag, const at::Tensor& t);
  at::Tensor recv(int from_stage, int tag);
  // Micro-batch mb's messages across the boundary after `stage`: the activation (header, values),
  // then its gradient (header, values).
  int activation_tag(int stage, int mb) const { return 4 * (stage * microbatches_ + mb); }
  int gradient_tag(int stage, int mb) const { return activation_tag(stage, mb) + 2; }

  ProcessGroup& pp_;
  std::vector<int> rank_of_;
  int microbatches_;
  std::vector<PendingSend> sends_;
  std::map<int, at::Tensor> handed_over_;  // by tag: sent to a stage on this rank, not yet taken
};

}  // namespace fsdp::pp
