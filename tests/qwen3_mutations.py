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
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "mutation"))
from text_mutations import sh, verdict  # noqa: E402

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("worktree")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    wt = Path(args.worktree).resolve()
    only = set(filter(None, args.only.split(",")))
    build = ["cmake", "--build", "build", "-j2", "--target", "gpt_train", "fsdprun", "gpt_unit_tests"]
    rows, survived = [], 0
    for mid, path, original, mutated, tests in MUTATIONS:
        if only and mid not in only:
            continue
        text = (wt / path).read_text()
        if text.count(original) != 1:
            sys.exit(f"{mid}: the original text occurs {text.count(original)} times in {path}")
        try:
            (wt / path).write_text(text.replace(original, mutated))
            built = sh(build, wt)
            if built.returncode != 0:
                sys.exit(f"{mid}: the mutated build failed:\n{built.stdout[-3000:]}")
            verdicts = []
            for test in tests:
                if test.endswith(".py"):
                    run = sh([sys.executable, test, str(wt / "build" / "bin")], wt, timeout=900)
                    verdicts.append(verdict(run, ("Error", "assert")) + f" {Path(test).name}")
                else:
                    run = sh([str(wt / "build" / "bin" / "gpt_unit_tests"), f"--gtest_filter={test}"], wt, timeout=900)
                    verdicts.append(verdict(run, ("Failure", "FAILED  ]", "what()")) + f" {test}")
            survived += any(v.startswith("SURVIVED") for v in verdicts)
            rows.append(f"| {mid} | `{path}` | {'; '.join(verdicts)} |")
            print(rows[-1], flush=True)
        finally:
            sh(["git", "checkout", "--", path], wt)
    sh(build, wt)
    print("| mutation | file | result |\n|---|---|---|\n" + "\n".join(rows))
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
