#!/usr/bin/env python3
"""Does each check of how gpt_train reads Hugging Face folders as transformers 5.23 does (and of
--resume's model settings, near-miss token headers) have a test that catches it? The mutations,
as data: (id, file, exact original text, mutated text, [cases that must turn red]). The cases are
rows of tests/bad_input_table.py and tests/bad_plan_table.py, or (prefixed "hf_llama_e2e:") labels
that tests/hf_llama_e2e.py prints.

Results (by hand, session of issue 49 item 7, HEAD 'hf-reading'): the ten mutations of RUN_TOGETHER
applied at once, gpt_train and fsdp_plan rebuilt, the three scripts run: every named case red —
the typed reads' mutations abort with nlohmann's type_error (`terminate called`), exactly the bug
they fix; model_type-optional reads "model_type is \"\""; llama3-keys-defaulted trains to a NaN
loss; rope-theta-not-compared resumes silently (exit 0); tied-head-not-compared fails later in
load_sharded without naming the setting; mistral-window-optional and second-copy-unchecked exit 0;
per-layer-rope-read fails later without naming it. Not run yet: own-head-tied,
empty-rope-scaling-counts, rope-object-omp-first, stale-shards-kept, quantization-config-kept (each
stops hf_llama_e2e at its case, so each needs its own build).

    .venv/bin/python tests/hf_reading_mutations.py WORKTREE   # the rows of bad_input_table.py only
"""
import sys
from pathlib import Path

HF = "examples/gpt/hf_folder.cpp"
LLAMA = "examples/gpt/llama/hf_llama.cpp"
MUTATIONS = [
    [  # group 1: bad_input_table + bad_plan_table, and hf_llama_e2e's own-head case
        ("bool-untyped", HF, "  TORCH_CHECK(value.is_boolean(), path,", "  TORCH_CHECK(true, path,",
         ['HF tie_word_embeddings "true" (a string)', 'fsdp_plan config.json tie_word_embeddings "true" (a string)']),
        ("string-untyped", HF, "  TORCH_CHECK(value.is_string(), path,", "  TORCH_CHECK(true, path,",
         ["HF rope_type 7 (a number)", "config.json model_type a 100 KB value"]),
        ("model-type-optional", HF, 'TORCH_CHECK(c.json.contains("model_type"), where,',
         'TORCH_CHECK(true, where,', ["HF config.json without model_type", "fsdp_plan config.json without model_type"]),
        ("llama3-keys-defaulted", LLAMA, 'TORCH_CHECK(rope.contains(key) && !rope[key].is_null(), where,',
         'TORCH_CHECK(true, where,', ["HF llama3 rope without factor"]),
        ("near-miss-header-read-as-ids", "examples/gpt/data.cpp", "  TORCH_CHECK(!near_miss_header(header), flag,",
         "  TORCH_CHECK(true, flag,", ["--data-tokens, llm.c header with a wrong magic"]),
        ("rope-theta-not-compared", "examples/gpt/model_settings.cpp", '          {"rope_theta", config.rope_theta},\n',
         "", ["--resume, other --rope-theta"]),
        ("tied-head-not-compared", "examples/gpt/model_settings.cpp", '          {"tied_head", config.head_is_wte()},\n',
         "", ["--resume, --tie-head added"]),
        ("own-head-tied", HF, "  if (!HfWeights(dir, family.hf_naming(model)).holds_own_head()) return;", "  return;",
         ["hf_llama_e2e: tie_word_embeddings true beside the file's own lm_head"]),
    ],
    [  # group 2: hf_llama_e2e, one case each run
        ("empty-rope-scaling-counts", LLAMA, "    if (config[key].empty()) continue;\n", "",
         ["hf_llama_e2e: rope_scaling {} beside rope_parameters"]),
    ],
    [
        ("rope-object-omp-first", LLAMA, "config.contains(key) && !config[key].is_null() ? config",
         "false ? config", ["hf_llama_e2e: original_max_position_embeddings 64 at the top, 16 in rope_parameters"]),
    ],
    [
        ("stale-shards-kept", HF, "  for (const fs::path& shard : stale) fs::remove(shard);\n", "",
         ["hf_llama_e2e: export onto a sharded folder"]),
    ],
    [
        ("quantization-config-kept", HF, '  out.erase("quantization_config");', "",
         ["hf_llama_e2e: export onto a sharded folder (quantization_config)"]),
    ],
    [
        ("mistral-window-optional", LLAMA,
         '  if (type == "qwen2" && !boolean(config, "use_sliding_window", false, where)) return 0;',
         '  if (!boolean(config, "use_sliding_window", type == "mistral", where)) return 0;',
         ["hf_llama_e2e: a Mistral's window with use_sliding_window false"]),
        ("per-layer-rope-read", LLAMA, "      TORCH_CHECK(!value.is_object(), where,", "      TORCH_CHECK(true, where,",
         ["hf_llama_e2e: Qwen2 per-layer rope_parameters"]),
        ("second-copy-unchecked", HF, "          if (!listed.empty()) check_second_copy(*file, entry.name, listed);\n",
         "", ["hf_llama_e2e: a tensor in two shards, other values"]),
    ],
]


RUN_TOGETHER = {"bool-untyped", "string-untyped", "model-type-optional", "llama3-keys-defaulted",
                "near-miss-header-read-as-ids", "rope-theta-not-compared", "tied-head-not-compared",
                "mistral-window-optional", "per-layer-rope-read", "second-copy-unchecked"}


def main():
    """The runner of bad_input_mutations.py on the mutations whose cases are bad_input_table rows."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bad_input_mutations as runner
    rows = [[(i, f, o, m, [c for c in cases if not c.startswith(("hf_llama_e2e:", "fsdp_plan", "config.json"))])
             for i, f, o, m, cases in group] for group in MUTATIONS]
    rows = [[m for m in group if m[4]] for group in rows]
    runner.run_for_table([g for g in rows if g], Path(__file__).with_name("bad_input_table.py"))


if __name__ == "__main__":
    main()
