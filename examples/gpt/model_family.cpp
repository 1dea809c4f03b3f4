#include "model_family.h"

#include "gpt2/gpt2_family.h"
#include "llama/llama_family.h"

namespace gpt {

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> families = {&gpt2_family(), &llama_family()};
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
