#include "model_family.h"

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

}  // namespace gpt
