#include <fsdp/options.h>
#include <fsdp/plan.h>

#include <fsdp/bounded_json.h>
#include <fsdp/checked_math.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdp {

namespace {

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: return "fp32";
    case c10::kBFloat16: return "bf16";
    case c10::kHalf: return "fp16";
    default: return c10::toString(dtype);
  }
}

// [Note: model description checks]
// A description is a user's file: every number is a size, a count or a rate, so each must be a
// whole number in [0, 2^63) (or, for work, a finite number >= 0) as JSON writes it, never cast
// from a float (1e30 as int64 is undefined behaviour), and each error names its JSON path
// (`units[2].activations.saved`) and shows the value cut to a length.

[[noreturn]] void refuse(const std::string& path, const nlohmann::json& value, const char* rule) {
  TORCH_CHECK(false, "model description: ", path, " is ", json_excerpt(value), ", not ", rule);
}

const nlohmann::json* member(const nlohmann::json& json, const char* key, const std::string& where,
                             bool required) {
  if (json.contains(key)) return &json.at(key);
  TORCH_CHECK(!required, "model description: ", where.empty() ? "the model" : where, " has no \"",
              key, "\"");
  return nullptr;
}

std::string path_of(const std::string& where, const char* key) {
  return where.empty() ? key : where + "." + key;
}

int64_t size_value(const nlohmann::json& value, const std::string& path) {
  if (value.is_number_unsigned() && value.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) {
    return value.get<int64_t>();
  }
  if (value.is_number_integer() && !value.is_number_unsigned() && value.get<int64_t>() >= 0) {
    return value.get<int64_t>();
  }
  refuse(path, value, "a whole number in [0, 2^63) (bytes or a count)");
}

int64_t size_field(const nlohmann::json& json, const char* key, const std::string& where, bool required) {
  const nlohmann::json* value = member(json, key, where, required);
  return value ? size_value(*value, path_of(where, key)) : 0;
}

double work_field(const nlohmann::json& json, const char* key, const std::string& where) {
  const nlohmann::json* value = member(json, key, where, false);
  if (!value) return 0;
  if (!value->is_number() || !std::isfinite(value->get<double>()) || value->get<double>() < 0) {
    refuse(path_of(where, key), *value, "a finite number >= 0");
  }
  return value->get<double>();
}

std::string text_field(const nlohmann::json& json, const char* key, const std::string& where,
                       const std::string& fallback, bool required) {
  const nlohmann::json* value = member(json, key, where, required);
  if (!value) return fallback;
  if (!value->is_string()) refuse(path_of(where, key), *value, "a string");
  return value->get<std::string>();
}

c10::ScalarType dtype_field(const nlohmann::json& json, const char* key, const std::string& where) {
  const std::string name = text_field(json, key, where, "fp32", false);
  try {
    return parse_dtype(name);
  } catch (const c10::Error&) {
    refuse(path_of(where, key), name, "\"fp32\", \"bf16\" or \"fp16\"");
  }
}

const nlohmann::json& object_at(const nlohmann::json& json, const std::string& path) {
  if (!json.is_object()) refuse(path, json, "a JSON object");
  return json;
}

const nlohmann::json& list_field(const nlohmann::json& json, const char* key, const std::string& where) {
  const nlohmann::json* value = member(json, key, where, true);
  if (!value->is_array()) refuse(path_of(where, key), *value, "a list");
  return *value;
}

nlohmann::json activations_json(const PlanActivations& a) {
  return {{"saved", a.saved}, {"checkpointed", a.checkpointed}, {"forward_transient", a.forward_transient},
          {"backward_transient", a.backward_transient}};
}

PlanActivations activations_from(const nlohmann::json& json, const std::string& where) {
  object_at(json, where);
  PlanActivations a;
  a.saved = size_field(json, "saved", where, true);
  a.checkpointed = size_field(json, "checkpointed", where, false);
  a.forward_transient = size_field(json, "forward_transient", where, false);
  a.backward_transient = size_field(json, "backward_transient", where, false);
  return a;
}

const std::vector<std::string>& tp_kind_names() {
  static const std::vector<std::string> names = {"all_gather", "reduce_scatter", "all_reduce"};
  return names;
}

nlohmann::json unit_json(const PlanUnit& u) {
  nlohmann::json params = nlohmann::json::array();
  for (const auto& p : u.params) {
    nlohmann::json param = {{"name", p.name}, {"shape", p.shape}, {"dtype", dtype_name(p.dtype)}};
    if (!p.requires_grad) param["requires_grad"] = false;  // absent: trained, as files before it
    if (p.full_precision) param["full_precision"] = true;
    if (p.tp_dim >= 0) param["tp_dim"] = p.tp_dim;  // absent: replicated (or no TP)
    params.push_back(std::move(param));
  }
  nlohmann::json unit = {{"name", u.name}, {"params", params}, {"activations", activations_json(u.activations)},
          {"forward_flops", u.forward_flops}, {"forward_attention_flops", u.forward_attention_flops},
          {"forward_transcendentals", u.forward_transcendentals},
          {"forward_memory_bytes", u.forward_memory_bytes}, {"forward_ops", u.forward_ops},
          {"backward_workspace", u.backward_workspace}};
  if (!u.tp_collectives.empty()) {  // absent without TP: descriptions as before
    nlohmann::json tp = nlohmann::json::array();
    for (const auto& c : u.tp_collectives) {
      nlohmann::json one = {{"kind", tp_kind_names()[c.kind]}, {"what", c.what}, {"backward", c.backward},
                            {"per_sequence", c.per_sequence}, {"bytes", c.bytes}};
      if (!c.parameter.empty()) one["parameter"] = c.parameter;
      tp.push_back(std::move(one));
    }
    unit["tp_collectives"] = tp;
  }
  return unit;
}

// read(item, its path) of each item of `list`, whose path is `path`.
template <typename Read>
auto items_of(const nlohmann::json& list, const std::string& path, Read read) {
  std::vector<decltype(read(list, path))> out;
  for (size_t i = 0; i < list.size(); ++i) out.push_back(read(list[i], path + "[" + std::to_string(i) + "]"));
  return out;
}

// An optional true/false field.
bool flag_field(const nlohmann::json& json, const char* key, const std::string& where, bool absent) {
  if (!json.contains(key)) return absent;
  const nlohmann::json& value = json.at(key);
  if (!value.is_boolean()) refuse(where + "." + key, value, "true or false");
  return value.get<bool>();
}

PlanParam param_from(const nlohmann::json& json, const std::string& where) {
  object_at(json, where);
  PlanParam param;
  param.name = text_field(json, "name", where, "", true);
  const nlohmann::json& shape = list_field(json, "shape", where);
  param.shape = items_of(shape, where + ".shape", size_value);
  if (!checked_product(param.shape)) refuse(where + ".shape", shape, "a shape whose elements int64 counts");
  param.dtype = dtype_field(json, "dtype", where);
  param.requires_grad = flag_field(json, "requires_grad", where, true);
  param.full_precision = flag_field(json, "full_precision", where, false);
  if (json.contains("tp_dim")) {
    const nlohmann::json& dim = json.at("tp_dim");
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0 || dim.get<int64_t>() >= static_cast<int64_t>(param.shape.size())) {
      refuse(where + ".tp_dim", dim, "one of the shape's dimensions (0-based): the one tensor parallelism splits");
    }
    param.tp_dim = dim.get<int64_t>();
  }
  return param;
}

PlanTpCollective tp_collective_from(const nlohmann::json& json, const std::string& where) {
  object_at(json, where);
  PlanTpCollective c;
  const std::string kind = text_field(json, "kind", where, "", true);
  const auto& names = tp_kind_names();
  const auto it = std::find(names.begin(), names.end(), kind);
  if (it == names.end()) refuse(where + ".kind", kind, "\"all_gather\", \"reduce_scatter\" or \"all_reduce\"");
  c.kind = static_cast<PlanTpCollective::Kind>(it - names.begin());
  c.what = text_field(json, "what", where, "", false);
  c.backward = flag_field(json, "backward", where, false);
  c.per_sequence = flag_field(json, "per_sequence", where, true);
  c.bytes = size_field(json, "bytes", where, true);
  c.parameter = text_field(json, "parameter", where, "", false);
  return c;
}

PlanUnit unit_from(const nlohmann::json& json, const std::string& where) {
  object_at(json, where);
  PlanUnit u;
  u.name = text_field(json, "name", where, "", false);
  u.params = items_of(list_field(json, "params", where), where + ".params", param_from);
  if (json.contains("activations")) u.activations = activations_from(json.at("activations"), where + ".activations");
  u.forward_flops = work_field(json, "forward_flops", where);
  u.forward_attention_flops = work_field(json, "forward_attention_flops", where);
  u.forward_transcendentals = work_field(json, "forward_transcendentals", where);
  u.forward_memory_bytes = work_field(json, "forward_memory_bytes", where);
  u.forward_ops = size_field(json, "forward_ops", where, false);
  u.backward_workspace = size_field(json, "backward_workspace", where, false);
  if (json.contains("tp_collectives")) {
    u.tp_collectives = items_of(list_field(json, "tp_collectives", where), where + ".tp_collectives", tp_collective_from);
  }
  return u;
}

// Parameter names are the model's (FSDP finds each by it), unit names its modules': each once.
void check_unique_names(const PlanModel& m) {
  std::map<std::string, std::string> params, units;  // name -> the JSON path that has it
  const auto once = [](std::map<std::string, std::string>& seen, const std::string& name,
                       const std::string& path, const char* what) {
    const auto [it, fresh] = seen.emplace(name, path);
    TORCH_CHECK(fresh, "model description: ", path, " is ", json_excerpt(name), ", the ", what,
                " name of ", it->second, " too: each ", what, " has its own name");
  };
  const auto unit_params = [&](const PlanUnit& u, const std::string& where) {
    for (size_t i = 0; i < u.params.size(); ++i) {
      once(params, u.params[i].name, where + ".params[" + std::to_string(i) + "].name", "parameter");
    }
  };
  unit_params(m.root, "root");
  for (size_t i = 0; i < m.units.size(); ++i) {
    const std::string where = "units[" + std::to_string(i) + "]";
    if (!m.units[i].name.empty()) once(units, m.units[i].name, where + ".name", "unit");
    unit_params(m.units[i], where);
  }
}

}  // namespace

nlohmann::json plan_model_json(const PlanModel& m) {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& u : m.units) units.push_back(unit_json(u));
  nlohmann::json model = {{"name", m.name}, {"compute_dtype", dtype_name(m.compute_dtype)}, {"root", unit_json(m.root)},
          {"root_pre", activations_json(m.root_pre)}, {"units", units}, {"sequence_tokens", m.sequence_tokens},
          {"input_bytes_per_sequence", m.input_bytes_per_sequence}, {"resident_bytes", m.resident_bytes},
          {"step_all_reduce_bytes", m.step_all_reduce_bytes}};
  if (m.tp_size > 1) model["tp_size"] = m.tp_size;
  return model;
}

PlanModel plan_model_from_json(const nlohmann::json& json) {
  object_at(json, "the description");
  PlanModel m;
  m.name = text_field(json, "name", "", "model", false);
  m.compute_dtype = dtype_field(json, "compute_dtype", "");
  m.root = unit_from(*member(json, "root", "", true), "root");
  if (json.contains("root_pre")) m.root_pre = activations_from(json.at("root_pre"), "root_pre");
  m.units = items_of(list_field(json, "units", ""), "units", unit_from);
  check_unique_names(m);
  m.sequence_tokens = size_field(json, "sequence_tokens", "", true);
  // 0 tokens would plan a step that trains on nothing ("0 tokens/s").
  if (m.sequence_tokens == 0) {
    refuse("sequence_tokens", json.at("sequence_tokens"), "a count >= 1 (the tokens of one sequence)");
  }
  m.input_bytes_per_sequence = size_field(json, "input_bytes_per_sequence", "", false);
  m.resident_bytes = size_field(json, "resident_bytes", "", false);
  m.step_all_reduce_bytes = size_field(json, "step_all_reduce_bytes", "", false);
  if (json.contains("tp_size")) {
    const int64_t tp = size_field(json, "tp_size", "", true);
    if (tp < 1 || tp > (1 << 20)) refuse("tp_size", json.at("tp_size"), "a TP size in [1, 2^20]");
    m.tp_size = static_cast<int>(tp);
  }
  return m;
}

}  // namespace fsdp
