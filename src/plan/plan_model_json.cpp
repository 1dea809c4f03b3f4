#include <fsdp/options.h>
#include <fsdp/plan.h>

#include <c10/util/Exception.h>

#include <string>

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

// json[key] as T, or an error naming where it is missing or of the wrong kind.
template <typename T>
T field(const nlohmann::json& json, const char* key, const std::string& where, const T& fallback, bool required) {
  if (!json.contains(key)) {
    TORCH_CHECK(!required, "model description: ", where, " has no \"", key, "\"");
    return fallback;
  }
  try {
    return json.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    TORCH_CHECK(false, "model description: ", where, ".", key, " is ", json.at(key).dump(),
                ", not a ", std::is_same_v<T, std::string> ? "string" : "number");
  }
}

nlohmann::json activations_json(const PlanActivations& a) {
  return {{"saved", a.saved}, {"checkpointed", a.checkpointed}, {"forward_transient", a.forward_transient},
          {"backward_transient", a.backward_transient}};
}

PlanActivations activations_from(const nlohmann::json& json, const std::string& where) {
  PlanActivations a;
  a.saved = field<int64_t>(json, "saved", where, 0, true);
  a.checkpointed = field<int64_t>(json, "checkpointed", where, 0, false);
  a.forward_transient = field<int64_t>(json, "forward_transient", where, 0, false);
  a.backward_transient = field<int64_t>(json, "backward_transient", where, 0, false);
  return a;
}

nlohmann::json unit_json(const PlanUnit& u) {
  nlohmann::json params = nlohmann::json::array();
  for (const auto& p : u.params) params.push_back({{"name", p.name}, {"shape", p.shape}, {"dtype", dtype_name(p.dtype)}});
  return {{"name", u.name}, {"params", params}, {"activations", activations_json(u.activations)},
          {"forward_flops", u.forward_flops}, {"forward_attention_flops", u.forward_attention_flops},
          {"forward_transcendentals", u.forward_transcendentals},
          {"forward_memory_bytes", u.forward_memory_bytes}, {"forward_ops", u.forward_ops},
          {"backward_workspace", u.backward_workspace}};
}

PlanUnit unit_from(const nlohmann::json& json, const std::string& where) {
  PlanUnit u;
  u.name = field<std::string>(json, "name", where, "", false);
  const std::string here = where + (u.name.empty() ? "" : " (" + u.name + ")");
  TORCH_CHECK(json.contains("params") && json.at("params").is_array(), "model description: ", here,
              " has no \"params\" list");
  for (const auto& p : json.at("params")) {
    PlanParam param;
    param.name = field<std::string>(p, "name", here + ".params", "", true);
    TORCH_CHECK(p.contains("shape") && p.at("shape").is_array(), "model description: ", here, ".params (",
                param.name, ") has no \"shape\" list");
    for (const auto& d : p.at("shape")) {
      TORCH_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, "model description: ", here, ".params (",
                  param.name, ").shape holds ", d.dump(), ", not a size");
      param.shape.push_back(d.get<int64_t>());
    }
    param.dtype = parse_dtype(field<std::string>(p, "dtype", here, "fp32", false));
    u.params.push_back(param);
  }
  if (json.contains("activations")) u.activations = activations_from(json.at("activations"), here + ".activations");
  u.forward_flops = field<double>(json, "forward_flops", here, 0, false);
  u.forward_attention_flops = field<double>(json, "forward_attention_flops", here, 0, false);
  u.forward_transcendentals = field<double>(json, "forward_transcendentals", here, 0, false);
  u.forward_memory_bytes = field<double>(json, "forward_memory_bytes", here, 0, false);
  u.forward_ops = field<int64_t>(json, "forward_ops", here, 0, false);
  u.backward_workspace = field<int64_t>(json, "backward_workspace", here, 0, false);
  return u;
}

}  // namespace

nlohmann::json plan_model_json(const PlanModel& m) {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& u : m.units) units.push_back(unit_json(u));
  return {{"name", m.name}, {"compute_dtype", dtype_name(m.compute_dtype)}, {"root", unit_json(m.root)},
          {"root_pre", activations_json(m.root_pre)}, {"units", units}, {"sequence_tokens", m.sequence_tokens},
          {"input_bytes_per_sequence", m.input_bytes_per_sequence}, {"resident_bytes", m.resident_bytes},
          {"step_all_reduce_bytes", m.step_all_reduce_bytes}};
}

PlanModel plan_model_from_json(const nlohmann::json& json) {
  TORCH_CHECK(json.is_object(), "model description: expected a JSON object, got ", json.type_name());
  PlanModel m;
  m.name = field<std::string>(json, "name", "the model", "model", false);
  m.compute_dtype = parse_dtype(field<std::string>(json, "compute_dtype", "the model", "fp32", false));
  TORCH_CHECK(json.contains("root"), "model description: the model has no \"root\" unit");
  m.root = unit_from(json.at("root"), "root");
  if (json.contains("root_pre")) m.root_pre = activations_from(json.at("root_pre"), "root_pre");
  TORCH_CHECK(json.contains("units") && json.at("units").is_array(), "model description: the model has no \"units\" list");
  for (size_t i = 0; i < json.at("units").size(); ++i) {
    m.units.push_back(unit_from(json.at("units")[i], "units[" + std::to_string(i) + "]"));
  }
  m.sequence_tokens = field<int64_t>(json, "sequence_tokens", "the model", 0, true);
  m.input_bytes_per_sequence = field<int64_t>(json, "input_bytes_per_sequence", "the model", 0, false);
  m.resident_bytes = field<int64_t>(json, "resident_bytes", "the model", 0, false);
  m.step_all_reduce_bytes = field<int64_t>(json, "step_all_reduce_bytes", "the model", 0, false);
  return m;
}

}  // namespace fsdp
