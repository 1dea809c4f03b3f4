#pragma once
// How Muon moves a matrix to its owner and back ([Note: Muon's owners]): each rank holds a 1-D
// piece of each matrix (its part of the flattened matrix: the pieces of the members, in member
// order, make the whole). One all-to-all brings each owner every member's piece of the matrices
// it owns; another sends each member its piece of the owners' results. Both carry bf16: the
// Newton-Schulz iteration casts its input to bf16 first and returns bf16, so rounding on the
// sender is the rounding torch does, and the result moves as it is made. They run on the device
// seam's collectives for the pieces' device (NCCL's all-to-all for CUDA tensors, no host copy).

#include "comm/collectives.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace fsdp::optim::muon {

/// One matrix's part in an exchange.
struct ExchangedMatrix {
  std::vector<int64_t> shape;         ///< of the whole matrix
  std::vector<int64_t> piece_numels;  ///< of each member of the group, in member order
  int owner = 0;                      ///< a member
};

/// The whole of each matrix this rank owns (in the order of `matrices`), in its shape, from every
/// member's piece: `pieces[i]` is this rank's piece of `matrices[i]` (1-D, bf16).
std::vector<at::Tensor> gather_to_owners(Collectives& group, const std::vector<ExchangedMatrix>& matrices,
                                         const std::vector<at::Tensor>& pieces);

/// This rank's piece (1-D) of each of `matrices`, from their owners: `owned` holds this rank's
/// results for the matrices it owns, in order, each in the matrix's shape, of `options` (the
/// dtype and device of the pieces returned).
std::vector<at::Tensor> scatter_from_owners(Collectives& group, const std::vector<ExchangedMatrix>& matrices,
                                            const std::vector<at::Tensor>& owned, const at::TensorOptions& options);

}  // namespace fsdp::optim::muon
