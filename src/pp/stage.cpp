// A stage: a contiguous run of the model's parts, its parameters under the model's own names
// ([Note: pipeline stages and schedules]).
#include <fsdp/pipeline.h>

#include "pp/part_call.h"
#include "pp/tied_weights.h"
#include "pp/stage_sharding.h"

#include <c10/util/Exception.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::pp {

namespace {

bool is_under_module(const std::string& name, const std::string& prefix) {
  return name == prefix || (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
                            name[prefix.size()] == '.');
}

// Each part must be the model's own module of that name (not a copy), so that names are the model's.
void check_parts(torch::nn::Module& model, const std::vector<Part>& parts) {
  std::map<std::string, const torch::nn::Module*> modules;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) modules[item.key()] = item.value().get();
  std::map<std::string, int> seen;
  for (const Part& part : parts) {
    auto found = modules.find(part.name);
    TORCH_CHECK(found != modules.end(), "pipeline: part '", part.name, "' is not a module of the model ",
                "(its names are those of model.named_modules(), e.g. \"h.3\")");
    TORCH_CHECK(!part.module.is_empty() && part.module.ptr().get() == found->second, "pipeline: part '", part.name,
                "' is not the model's module of that name: give the model's own module, not a copy");
    TORCH_CHECK(seen[part.name]++ == 0, "pipeline: part '", part.name, "' is listed twice");
  }
}

// The stage of each part; throws unless every part is selected once and the stages follow the chain.
std::vector<int> stage_of_parts(const std::vector<Part>& parts, const std::vector<std::vector<std::string>>& fqns) {
  std::vector<int> stage_of(parts.size(), -1);
  for (size_t s = 0; s < fqns.size(); ++s) {
    TORCH_CHECK(!fqns[s].empty(), "pipeline: stage ", s, " has no modules; give each stage at least one");
    for (const std::string& fqn : fqns[s]) {
      bool selected = false;
      for (size_t p = 0; p < parts.size(); ++p) {
        if (!is_under_module(parts[p].name, fqn)) continue;
        TORCH_CHECK(stage_of[p] < 0 || stage_of[p] == static_cast<int>(s), "pipeline: part '", parts[p].name,
                    "' is in stage ", stage_of[p], " and stage ", s, "; give each module to one stage");
        stage_of[p] = static_cast<int>(s);
        selected = true;
      }
      TORCH_CHECK(selected, "pipeline: stage ", s, "'s module '", fqn, "' is no part of the forward chain ",
                  "nor above one; name a part (e.g. \"h.3\") or a module holding parts (\"h\")");
    }
  }
  for (size_t p = 0; p < parts.size(); ++p) {
    TORCH_CHECK(stage_of[p] >= 0, "pipeline: part '", parts[p].name, "' is in no stage; every part of the ",
                "forward chain must be given to a stage");
    TORCH_CHECK(p == 0 || stage_of[p] >= stage_of[p - 1], "pipeline: part '", parts[p].name, "' (stage ",
                stage_of[p], ") follows '", parts[p - 1].name, "' (stage ", stage_of[p - 1],
                "); stages must take the forward chain in order");
  }
  return stage_of;
}

// Every parameter of the model under each of its names, with the stage holding that name; every
// parameter must be under some part.
std::vector<ParameterPlace> places_of_parameters(torch::nn::Module& model, const std::vector<Part>& parts,
                                                 const std::vector<int>& stage_of_part) {
  std::vector<ParameterPlace> out;
  for (const auto& item : model.named_parameters()) {
    int stage = -1;
    for (size_t p = 0; p < parts.size() && stage < 0; ++p) {
      if (is_under_module(item.key(), parts[p].name)) stage = stage_of_part[p];
    }
    TORCH_CHECK(stage >= 0, "pipeline: parameter '", item.key(), "' is in no part of the forward chain, so no ",
                "stage would train it; hold it in a module that is a part");
    out.push_back({item.key(), item.value(), stage});
  }
  return out;
}

}  // namespace

Stage::Stage(torch::nn::Module& model, std::vector<Part> parts,
             const std::vector<std::vector<std::string>>& module_fqns_per_stage, int index)
    : index_(index), num_stages_(static_cast<int>(module_fqns_per_stage.size())) {
  TORCH_CHECK(index >= 0 && index < num_stages_, "pipeline: stage ", index, " of ", num_stages_,
              " (module_fqns_per_stage has one list per stage)");
  check_parts(model, parts);
  const std::vector<int> stage_of = stage_of_parts(parts, module_fqns_per_stage);
  for (size_t p = 0; p < parts.size(); ++p) {
    if (stage_of[p] == index) parts_.push_back(parts[p]);
  }
  const std::vector<ParameterPlace> places = places_of_parameters(model, parts, stage_of);
  for (const ParameterPlace& place : places) {
    (place.stage == index ? named_parameters_ : others_).insert(place.name, place.tensor);
  }
  tied_ = ties_of_stage(places, index);
}

std::vector<torch::Tensor> Stage::parameters() const {
  std::vector<torch::Tensor> out;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& item : named_parameters_) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) out.push_back(item.value());
  }
  return out;
}

std::vector<std::string> Stage::part_names() const {
  std::vector<std::string> out;
  for (const Part& part : parts_) out.push_back(part.name);
  return out;
}

torch::Tensor Stage::forward(torch::Tensor x) {
  if (sharded_) return sharded_->forward(x);  // through its FSDP unit ([Note: FSDP inside a stage])
  for (Part& part : parts_) x = call_part(part, std::move(x));
  return x;
}

}  // namespace fsdp::pp
