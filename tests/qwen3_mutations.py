#!/usr/bin/env python3
"""Do the Qwen3 family's tests catch what they claim? Each mutation below changes one line of the
family (examples/gpt/qwen3/, or the recipe line it relies on) the way a plausible bug would; this
script applies it in WORKTREE, rebuilds, runs each test meant to catch it, each of which must
fail, and restores the file with git checkout. The tests: tests/hf_qwen3_e2e.py (logits against
transformers, the round trip, --tp 2 against --reference, refusals) and the unit tests
Qwen3Family.* (tests/qwen3_family_test.cpp, in gpt_unit_tests).

    .venv/bin/python tests/qwen3_mutations.py WORKTREE [--only ID,...]

WORKTREE must be a configured build of this project (WORKTREE/build) with these files committed.
Prints a Markdown table: mutation -> each test red (its message), or SURVIVED (exit 1)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "mutation"))
import text_mutations  # noqa: E402

HF, UNIT = "tests/hf_qwen3_e2e.py", "Qwen3Family.*"
QWEN3, PLAN, HFQ = ("examples/gpt/qwen3/qwen3.cpp", "examples/gpt/qwen3/qwen3_plan.cpp",
                    "examples/gpt/qwen3/hf_qwen3.cpp")

# (id, file, exact original text, mutated text, [tests that must each turn red: a script or a
# gtest filter of gpt_unit_tests])
MUTATIONS = [
    ("q-norm-skipped", QWEN3,
     "return ln_q(split_heads(q_proj(x)));", "return split_heads(q_proj(x));", [HF, UNIT]),
    ("k-normed-with-q-norm", QWEN3,
     "return ln_k(split_heads(k_proj(x)));", "return ln_q(split_heads(k_proj(x)));", [HF, UNIT]),
    ("head-norm-width-from-dim-over-heads", QWEN3,
     "const int64_t d = config.head_size();", "const int64_t d = config.dim / config.heads;", [HF, UNIT]),
    ("head-dim-absent-read-as-dim-over-heads", HFQ,
     'if (!filled.contains("head_dim")) filled["head_dim"] = 128;', "", [HF]),
    ("q-and-k-norm-files-swapped", HFQ,  # the file's q_norm read into ln_k, its k_norm into ln_q
     '{{".attn.q_norm.", ".attn.ln_q."},\n' + " " * 59 + '{".attn.k_norm.", ".attn.ln_k."}};',
     '{{".attn.q_norm.", ".attn.ln_k."},\n' + " " * 59 + '{".attn.k_norm.", ".attn.ln_q."}};', [HF]),
    ("sliding-window-ignored", HFQ, "  if (!slides) return 0;\n", "  return 0;\n", [HF]),
    ("head-norm-gradients-not-summed-over-tp", "examples/gpt/tensor_parallel_plan.cpp",
     "if (layer.kind == LayerKind::LayerNorm || layer.kind == LayerKind::RMSNorm) {",
     "if ((layer.kind == LayerKind::LayerNorm || layer.kind == LayerKind::RMSNorm) && layer.name.rfind(\"attn.\", 0)) {",
     [HF, UNIT]),
    ("head-norm-activations-uncounted", PLAN,
     "product({T, heads_here, d, per_element}),", "product({0, per_element}),", [UNIT]),
    ("head-norm-gradients-not-planned-over-tp", PLAN,
     "  for (const char* norm : {\"attn.ln_q.weight\", \"attn.ln_k.weight\"}) {",
     "  for (const char* norm : std::vector<const char*>{}) {", [UNIT]),
]


def runs_of(tests):
    """Each test as text_mutations runs it: a script, or gpt_unit_tests with a gtest filter."""
    return [test if test.endswith(".py") else ("gpt_unit_tests", f"--gtest_filter={test}") for test in tests]


if __name__ == "__main__":
    text_mutations.main([(*m[:4], runs_of(m[4])) for m in MUTATIONS], ["gpt_train", "fsdprun", "gpt_unit_tests"],
                        keywords=("Error", "assert", "Failure", "FAILED  ]", "what()"))
