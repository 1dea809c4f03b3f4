#include "model_family.h"

#include <algorithm>
#include <set>

namespace gpt {

// Each family's accessor, declared from model_families.inc's list (its folder defines it).
#define FAMILY(folder) const ModelFamily& folder##_family();
#include "model_families.inc"
#undef FAMILY

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> families = {
#define FAMILY(folder) &folder##_family(),
#include "model_families.inc"
#undef FAMILY
  };
  return families;
}

const ModelFamily& family_named(const std::string& name) {
  std::string known;
  for (const ModelFamily* family : model_families()) {
    if (family->name() == name) return *family;
    known += (known.empty() ? "" : ", ") + family->name();
  }
  TORCH_CHECK(false, "no model family is named '", name, "' (gpt_train knows ", known, ")");
}

const ModelFamily& family_of(const GPTConfig& config) { return family_named(config.family); }

std::string families_taking(const std::string& flag) {
  std::string names;
  for (const ModelFamily* family : model_families()) {
    const std::vector<std::string> flags = family->flags();
    if (std::find(flags.begin(), flags.end(), flag) == flags.end()) continue;
    names += (names.empty() ? "" : ", ") + family->name();
  }
  return names;
}

void add_family_flags(CLI::App& app, GPTConfig& model) {
  for (const ModelFamily* family : model_families()) family->add_flags(app, model);
  std::set<std::string> done;
  for (const ModelFamily* family : model_families()) {
    for (const std::string& flag : family->flags()) {
      if (!done.insert(flag).second) continue;
      CLI::Option* option = app.get_option_no_throw(flag);
      TORCH_CHECK(option, "--model ", family->name(), " lists the flag ", flag, ", which no family adds");
      option->description("--model " + families_taking(flag) + ": " + option->get_description());
    }
  }
}

}  // namespace gpt
