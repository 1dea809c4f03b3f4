#pragma once
// What Muon's step checks before it moves anything: a matrix it can orthogonalize, a piece it
// can step, the same matrices stepped on every rank of the exchange.

#include "optim/muon_models.h"

#include <fsdp/distributed.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::optim::muon {

/// Refuses a parameter that is not 2-D, naming it (`which`) and the fix.
void check_matrix(const std::vector<int64_t>& shape, const std::string& which);

/// A forward without a backward may have left a unit unsharded ([Note: resharding between
/// steps]): the parameter must be its piece again before it is stepped.
void hold_piece_only(const ModelParams& model, const Located& m);

/// Every rank of `group` must step the same matrices (they meet in the exchanges): a rank whose
/// gradients differ in which are defined would pair the wrong pieces. One small all-reduce.
/// `stepped[i]`: whether matrices[i] is stepped now on this rank.
void check_same_matrices_stepped(ProcessGroup& group, const std::vector<bool>& stepped,
                                 const std::vector<const Located*>& matrices);

}  // namespace fsdp::optim::muon
