#include "optim/muon_phases.h"

#include <algorithm>

namespace fsdp::optim::muon {
namespace {

constexpr int64_t kBf16 = 2;  // bytes of what Muon exchanges and iterates on

// The iteration's own tensors on an m x n matrix: the iterate and the next one, the gram A and B.
int64_t iteration_elements(const MatrixShare& m) {
  const int64_t small = std::min(m.rows, m.cols);
  return 2 * m.rows * m.cols + 2 * small * small;
}

// Sums of the shares' elements that the phases name ([Note: Muon's step in phases]).
struct Totals {
  int64_t pieces = 0, owned = 0, replicated_results = 0, split_parts = 0, wholes = 0, tall_replicated = 0;
};

Totals totals_of(const std::vector<MatrixShare>& matrices) {
  Totals t;
  for (const MatrixShare& m : matrices) {
    t.pieces += m.piece;
    if (!m.owned) continue;
    t.owned += m.part;
    if (m.split) {
      t.split_parts += m.part;
      if (m.owned_whole) t.wholes += m.rows * m.cols;
    } else {
      t.replicated_results += m.part;
      if (m.rows > m.cols) t.tall_replicated += m.part;
    }
  }
  return t;
}

// The tp stage: parts to their tp owners, the wholes orthogonalized and laid out, parts back.
void tensor_parallel_phases(const std::vector<MatrixShare>& matrices, const Totals& t, std::vector<StepPhase>& phases) {
  if (t.split_parts == 0) return;
  const int64_t beside = t.pieces + t.owned + t.replicated_results;
  phases.push_back({"the tensor-parallel gather", beside + t.split_parts + t.wholes});
  phases.push_back({"assembling the whole matrices over tp", beside + 2 * t.wholes});
  int64_t results = 0;
  for (const MatrixShare& m : matrices) {
    if (!m.owned || !m.split || !m.owned_whole) continue;
    const int64_t mn = m.rows * m.cols, before = beside + t.wholes + results;
    phases.push_back({"orthogonalizing " + m.name, before + mn + iteration_elements(m)});
    phases.push_back({"laying out " + m.name + "'s result", before + 4 * mn});
    results += mn;
  }
  phases.push_back({"the tensor-parallel scatter", beside + 3 * t.wholes + t.split_parts});
}

}  // namespace

std::vector<StepPhase> step_phases(const std::vector<MatrixShare>& matrices) {
  const Totals t = totals_of(matrices);
  std::vector<StepPhase> phases;
  if (matrices.empty()) return phases;
  phases.push_back({"the first all-to-all", 2 * t.pieces + t.owned});
  phases.push_back({"assembling the matrices it owns", t.pieces + 2 * t.owned});
  int64_t results = 0;
  for (const MatrixShare& m : matrices) {
    if (!m.owned || m.split) continue;
    phases.push_back({"orthogonalizing " + m.name, t.pieces + t.owned + results + iteration_elements(m)});
    results += m.part;
  }
  tensor_parallel_phases(matrices, t, phases);
  phases.push_back({"the second all-to-all", 2 * t.pieces + 3 * t.owned + t.tall_replicated});
  for (StepPhase& phase : phases) phase.bytes *= kBf16;
  return phases;
}

StepPhase highest(const std::vector<StepPhase>& phases) {
  StepPhase top;
  for (const StepPhase& phase : phases) {
    if (phase.bytes > top.bytes) top = phase;
  }
  return top;
}

}  // namespace fsdp::optim::muon
