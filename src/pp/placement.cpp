// Where stages sit on the pp ranks: loop or V ([Note: V stages per rank]).
#include <fsdp/pipeline.h>

#include <c10/util/Exception.h>

#include <vector>

namespace fsdp::pp {

namespace {

void check_counts(int pp_size, int num_stages, Placement placement) {
  TORCH_CHECK(pp_size >= 1 && num_stages >= 1, "pipeline: ", num_stages, " stages over ", pp_size,
              " pp ranks; there must be at least one of each");
  if (placement == Placement::V) {
    TORCH_CHECK(num_stages == 2 * pp_size, "pipeline: ", num_stages, " stages over ", pp_size,
                " pp ranks in V placement; V placement (ZBV) holds exactly two stages per rank: give "
                "module_fqns_per_stage ", 2 * pp_size, " lists");
    return;
  }
  TORCH_CHECK(num_stages % pp_size == 0, "pipeline: ", num_stages, " stages over ", pp_size,
              " pp ranks; each rank holds the same number of stages: give module_fqns_per_stage a "
              "multiple of ", pp_size, " lists");
}

}  // namespace

Placement placement_of(Schedule schedule) { return schedule == Schedule::ZBV ? Placement::V : Placement::Loop; }

std::vector<int> stages_of_rank(int rank, int pp_size, int num_stages, Placement placement) {
  check_counts(pp_size, num_stages, placement);
  TORCH_CHECK(rank >= 0 && rank < pp_size, "pipeline: rank ", rank, " is not one of ", pp_size, " pp ranks");
  if (placement == Placement::V) return {rank, 2 * pp_size - 1 - rank};
  std::vector<int> out;
  for (int s = rank; s < num_stages; s += pp_size) out.push_back(s);
  return out;
}

int rank_of_stage(int stage, int pp_size, int num_stages, Placement placement) {
  check_counts(pp_size, num_stages, placement);
  TORCH_CHECK(stage >= 0 && stage < num_stages, "pipeline: stage ", stage, " of ", num_stages);
  if (placement == Placement::V) return stage < pp_size ? stage : 2 * pp_size - 1 - stage;
  return stage % pp_size;
}

}  // namespace fsdp::pp
