#include "optim/muon_tensor_parallel.h"

#include "optim/muon_exchange.h"

#include <fsdp/parallelize.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace fsdp::optim::muon {
namespace {

// The exchange's view of a matrix: every member's part flattened, in member order.
ExchangedMatrix exchanged_parts(const at::Tensor& part, int members, int owner) {
  return {{part.numel() * members}, std::vector<int64_t>(members, part.numel()), owner};
}

// The whole matrix from the members' flattened parts, as received by its owner.
at::Tensor assembled(const at::Tensor& received, const at::Tensor& part, const tp::Placement& placement, int members) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor& flat : received.reshape(-1).chunk(members)) parts.push_back(flat.view(part.sizes()));
  return tp::whole_from_parts(parts, placement);
}

// `whole` laid out for the exchange: each member's part, flattened, in member order.
at::Tensor laid_out_by_member(const at::Tensor& whole, const tp::Placement& placement, int members) {
  std::vector<at::Tensor> parts;
  for (int r = 0; r < members; ++r) parts.push_back(tp::part_of_whole(whole, placement, r).reshape(-1));
  return at::cat(parts);
}

}  // namespace

std::vector<at::Tensor> orthogonalize_split(
    Collectives& group, const std::vector<at::Tensor>& parts, const std::vector<tp::Placement>& placements,
    const std::vector<int>& owners, const std::function<at::Tensor(const at::Tensor& whole, size_t i)>& orthogonalize) {
  TORCH_CHECK(parts.size() == placements.size() && parts.size() == owners.size(),
              "Muon: a placement and an owner per tensor-parallel part are needed");
  if (parts.empty()) return {};
  const int members = group.size(), me = group.rank();
  for (const auto& placement : placements) {
    TORCH_CHECK(placement.tp && placement.tp->size() == members, "Muon: a tensor-parallel part exchanged over a "
                "group of ", members, " ranks belongs to a tp group of another size");
  }
  std::vector<ExchangedMatrix> exchanged;
  std::vector<at::Tensor> flat_parts;
  for (size_t i = 0; i < parts.size(); ++i) {
    exchanged.push_back(exchanged_parts(parts[i], members, owners[i]));
    flat_parts.push_back(parts[i].reshape(-1));
  }
  const std::vector<at::Tensor> received = gather_to_owners(group, exchanged, flat_parts);
  std::vector<at::Tensor> results;
  size_t k = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (owners[i] != me) continue;
    const at::Tensor whole = assembled(received.at(k++), parts[i], placements[i], members);
    results.push_back(laid_out_by_member(orthogonalize(whole, i), placements[i], members));
  }
  const std::vector<at::Tensor> mine = scatter_from_owners(group, exchanged, results, parts.front().options());
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < parts.size(); ++i) out.push_back(mine[i].view(parts[i].sizes()));
  return out;
}

}  // namespace fsdp::optim::muon
