#include "optim/muon_exchange.h"

#include "comm/collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace fsdp::optim::muon {
namespace {

// Where each member's part starts in a buffer holding `numels[r]` elements per member, in order.
std::vector<int64_t> starts_of(const std::vector<int64_t>& numels) {
  std::vector<int64_t> starts(numels.size(), 0);
  for (size_t r = 1; r < numels.size(); ++r) starts[r] = starts[r - 1] + numels[r - 1];
  return starts;
}

at::Tensor concatenated(const std::vector<at::Tensor>& parts, const at::TensorOptions& options) {
  return parts.empty() ? at::empty({0}, options) : at::cat(parts);
}

// What the members sent this rank for `send`'s counts.
at::Tensor exchanged(Collectives& group, const at::Tensor& send, const std::vector<int64_t>& send_numels,
                     const std::vector<int64_t>& receive_numels) {
  int64_t total = 0;
  for (int64_t n : receive_numels) total += n;
  at::Tensor received = at::empty({total}, send.options());
  group.all_to_all(received, send, send_numels, receive_numels);
  return received;
}

}  // namespace

std::vector<at::Tensor> gather_to_owners(Collectives& group, const std::vector<ExchangedMatrix>& matrices,
                                         const std::vector<at::Tensor>& pieces) {
  TORCH_CHECK(pieces.size() == matrices.size(), "Muon: a piece per matrix is needed");
  const int members = group.size(), me = group.rank();
  if (matrices.empty()) return {};
  std::vector<int64_t> send(members, 0), receive(members, 0);
  std::vector<at::Tensor> outgoing;  // member by member, each owner's matrices in order
  for (int r = 0; r < members; ++r) {
    for (size_t i = 0; i < matrices.size(); ++i) {
      if (matrices[i].owner != r) continue;
      outgoing.push_back(pieces[i].reshape(-1));
      send[r] += matrices[i].piece_numels.at(me);
    }
  }
  for (const auto& m : matrices) {
    if (m.owner != me) continue;
    for (int r = 0; r < members; ++r) receive[r] += m.piece_numels.at(r);
  }
  const at::Tensor received = exchanged(group, concatenated(outgoing, pieces.front().options()), send, receive);
  // Member r's part holds its pieces of this rank's matrices, in order.
  std::vector<int64_t> cursor = starts_of(receive);
  std::vector<at::Tensor> wholes;
  for (const auto& m : matrices) {
    if (m.owner != me) continue;
    std::vector<at::Tensor> parts;
    for (int r = 0; r < members; ++r) {
      parts.push_back(received.narrow(0, cursor[r], m.piece_numels[r]));
      cursor[r] += m.piece_numels[r];
    }
    wholes.push_back(at::cat(parts).view(m.shape));
  }
  return wholes;
}

std::vector<at::Tensor> scatter_from_owners(Collectives& group, const std::vector<ExchangedMatrix>& matrices,
                                            const std::vector<at::Tensor>& owned, const at::TensorOptions& options) {
  const int members = group.size(), me = group.rank();
  if (matrices.empty()) return {};
  std::vector<at::Tensor> flat_owned;
  for (const auto& result : owned) flat_owned.push_back(result.contiguous().view(-1));
  std::vector<int64_t> send(members, 0), receive(members, 0);
  std::vector<at::Tensor> outgoing;  // member by member: its piece of each matrix this rank owns
  for (int r = 0; r < members; ++r) {
    size_t k = 0;
    for (const auto& m : matrices) {
      if (m.owner != me) continue;
      const int64_t start = starts_of(m.piece_numels)[r];
      outgoing.push_back(flat_owned.at(k++).narrow(0, start, m.piece_numels[r]));
      send[r] += m.piece_numels[r];
    }
  }
  TORCH_CHECK(outgoing.empty() || flat_owned.size() * members == outgoing.size(),
              "Muon: a result per owned matrix is needed");
  for (const auto& m : matrices) receive[m.owner] += m.piece_numels.at(me);
  const at::Tensor received = exchanged(group, concatenated(outgoing, options), send, receive);
  // The owner's part holds this rank's piece of each of its matrices, in order.
  std::vector<int64_t> cursor = starts_of(receive);
  std::vector<at::Tensor> mine;
  for (const auto& m : matrices) {
    mine.push_back(received.narrow(0, cursor[m.owner], m.piece_numels[me]));
    cursor[m.owner] += m.piece_numels[me];
  }
  return mine;
}

}  // namespace fsdp::optim::muon
