// Activations and gradients between consecutive stages, across ranks or on one ([Note: V stages
// per rank]).
#include "pp/stage_messages.h"

#include "pp/activation_channel.h"

#include <c10/util/Exception.h>

#include <utility>

namespace fsdp::pp {

StageMessages::StageMessages(ProcessGroup& pp, std::vector<int> rank_of, int microbatches)
    : pp_(pp), rank_of_(std::move(rank_of)), microbatches_(microbatches) {}

void StageMessages::send_activation(int from_stage, int microbatch, const at::Tensor& t) {
  send(from_stage + 1, activation_tag(from_stage, microbatch), t);
}

at::Tensor StageMessages::recv_activation(int to_stage, int microbatch) {
  return recv(to_stage - 1, activation_tag(to_stage - 1, microbatch));
}

void StageMessages::send_gradient(int from_stage, int microbatch, const at::Tensor& t) {
  send(from_stage - 1, gradient_tag(from_stage - 1, microbatch), t);
}

at::Tensor StageMessages::recv_gradient(int to_stage, int microbatch) {
  return recv(to_stage + 1, gradient_tag(to_stage, microbatch));
}

void StageMessages::send(int to_stage, int tag, const at::Tensor& t) {
  const int peer = rank_of_.at(static_cast<size_t>(to_stage));
  if (peer == pp_.rank()) {
    handed_over_[tag] = t;
    return;
  }
  send_message(pp_, t, peer, tag, sends_);
}

at::Tensor StageMessages::recv(int from_stage, int tag) {
  const int peer = rank_of_.at(static_cast<size_t>(from_stage));
  if (peer != pp_.rank()) return recv_message(pp_, peer, tag);
  auto found = handed_over_.find(tag);
  TORCH_CHECK(found != handed_over_.end(), "pipeline: stage ", from_stage, " on this rank has not handed over ",
              "the message with tag ", tag, " yet; the schedule receives before it sends");
  at::Tensor t = std::move(found->second);
  handed_over_.erase(found);
  return t;
}

void StageMessages::finish() {
  for (PendingSend& send : sends_) send.wait();
  sends_.clear();
  TORCH_CHECK(handed_over_.empty(), "pipeline: ", handed_over_.size(), " message(s) between stages on this rank ",
              "were never taken; the schedule sends what no stage receives");
}

}  // namespace fsdp::pp
