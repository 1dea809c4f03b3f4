// Typed reads of a transformers config.json's fields (hf_folder.h's namespace hf): each names
// the file and the key at fault, as transformers' typed configs refuse what they cannot read.
#include "hf_folder.h"

#include <fsdp/bounded_json.h>

#include <c10/util/Exception.h>

#include <cmath>
#include <string>

namespace gpt {

using nlohmann::json;

namespace hf {

int64_t positive_size(const json& config, const std::string& key, const std::string& path,
                      int64_t max, const char* bound) {
  TORCH_CHECK(config.contains(key), path, " has no \"", key,
              "\": a transformers config.json states every size");
  const json& value = config[key];
  TORCH_CHECK((value.is_number_integer() && !value.is_number_unsigned() && value.get<int64_t>() >= 1) ||
                  (value.is_number_unsigned() && value.get<uint64_t>() >= 1),
              path, ": \"", key, "\" must be a positive whole number, got ",
              fsdp::json_excerpt(value));
  TORCH_CHECK(value.is_number_unsigned() ? value.get<uint64_t>() <= static_cast<uint64_t>(max)
                                         : value.get<int64_t>() <= max,
              path, ": \"", key, "\" is ", fsdp::json_excerpt(value), ", more than the ", max,
              " gpt_train builds (", bound, "); this is not a model it can train or plan");
  return value.get<int64_t>();
}

void require(const json& config, const std::string& key, const json& expected,
             const std::string& path, const std::string& why) {
  if (!config.contains(key) || config[key].is_null() || config[key] == expected) return;
  TORCH_CHECK(false, path, ": \"", key, "\" is ", fsdp::json_excerpt(config[key]),
              ", but gpt_train's model ", why, "; only ", expected.dump(), " can be loaded");
}

double positive_number(const json& config, const std::string& key, double fallback,
                       const std::string& path) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  const json& value = config[key];
  TORCH_CHECK(value.is_number() && std::isfinite(value.get<double>()) && value.get<double>() > 0,
              path, ": \"", key, "\" must be a positive number, got ", fsdp::json_excerpt(value));
  return value.get<double>();
}

bool boolean(const json& config, const std::string& key, bool fallback, const std::string& path) {
  if (!config.contains(key)) return fallback;
  const json& value = config[key];
  // transformers refuses a null flag (its configs' fields are typed bool): no default is read into it.
  TORCH_CHECK(!value.is_null(), path, ": \"", key, "\" is null; write true or false (transformers "
              "refuses null), or leave the key out for the default");
  TORCH_CHECK(value.is_boolean(), path, ": \"", key, "\" must be true or false, got ",
              fsdp::json_excerpt(value), " (a JSON ", value.type_name(), "; write it without quotes)");
  return value.get<bool>();
}

std::string text(const json& config, const std::string& key, const std::string& fallback,
                 const std::string& path) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  const json& value = config[key];
  TORCH_CHECK(value.is_string(), path, ": \"", key, "\" must be a string, got ",
              fsdp::json_excerpt(value));
  return value.get<std::string>();
}

bool ends_with(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace hf

}  // namespace gpt
