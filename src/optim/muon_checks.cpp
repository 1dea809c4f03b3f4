#include "optim/muon_checks.h"

#include "core/sharded_view.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

namespace fsdp::optim::muon {

void check_matrix(const std::vector<int64_t>& shape, const std::string& which) {
  TORCH_CHECK(shape.size() == 2, "fsdp::optim::Muon: ", which, " has shape ", c10::IntArrayRef(shape),
              ": Muon steps 2-D matrices only. Give it to AdamW instead (fsdp::optim::split_for_muon "
              "splits a model's parameters: hidden matrices for Muon, the rest for AdamW)");
}

void hold_piece_only(const ModelParams& model, const Located& m) {
  const detail::ShardedBuffer& buffer = model.view.buffers().at(m.buffer);
  if (!buffer.holds_shard_only()) buffer.reshard_unless_in_backward();
  TORCH_CHECK(buffer.holds_shard_only(), "fsdp::optim::Muon: unit '", buffer.unit_name(),
              "' is unsharded while its parameter '", m.param.name(), "' is stepped; step after "
              "backward has finished");
}

void check_same_matrices_stepped(ProcessGroup& group, const std::vector<bool>& stepped,
                                 const std::vector<const Located*>& matrices) {
  if (group.size() == 1) return;
  at::Tensor counts = at::zeros({static_cast<int64_t>(stepped.size())}, at::kInt);
  auto count = counts.accessor<int, 1>();
  for (size_t i = 0; i < stepped.size(); ++i) count[i] = stepped[i] ? 1 : 0;
  all_reduce_sum(group, counts);
  for (size_t i = 0; i < stepped.size(); ++i) {
    const int ranks = count[i];
    TORCH_CHECK(ranks == 0 || ranks == group.size(), "fsdp::optim::Muon: parameter '",
                matrices[i]->param.name(), "' has a gradient on ", ranks, " of the ", group.size(),
                " ranks of its shard group; every rank must step the same parameters (a gradient set "
                "or cleared by hand on some ranks only?)");
  }
}

}  // namespace fsdp::optim::muon
