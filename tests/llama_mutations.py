#!/usr/bin/env python3
"""Do the Llama's parity tests catch what they claim? Each mutation below changes one line of the
Llama (examples/gpt) the way a plausible bug would; this script applies it in WORKTREE, rebuilds
gpt_train, runs each test meant to catch it (tests/hf_llama_e2e.py: logits against transformers
and the export round trip; tests/llama_fsdp2_e2e.py: 10 steps against PyTorch FSDP2), each of
which must fail, and restores the file with git checkout.

    .venv/bin/python tests/llama_mutations.py WORKTREE [--only ID,...]

WORKTREE must be a configured build of this project (WORKTREE/build) with these files committed.
Prints a Markdown table: mutation -> each test red (its message), or SURVIVED (exit 1)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "mutation"))
import text_mutations  # noqa: E402

HF, FSDP2 = "tests/hf_llama_e2e.py", "tests/llama_fsdp2_e2e.py"

# (id, file, exact original text, mutated text, [tests that must each turn red])
MUTATIONS = [
    ("rope-first-half-turned-the-other-way", "examples/gpt/llama/rotary.cpp",
     "o[i] = xr[i] * c[i] + (-xr[i + half]) * s[i];", "o[i] = xr[i] * c[i] + xr[i + half] * s[i];",
     [HF, FSDP2]),
    ("rope-gradient-turned-the-wrong-way", "examples/gpt/llama/rotary.cpp",
     "o[i] = xr[i] * c[i] + xr[i + half] * s[i + half];", "o[i] = xr[i] * c[i] - xr[i + half] * s[i + half];",
     [FSDP2]),
    ("kv-heads-tiled-not-grouped", "examples/gpt/llama/llama.cpp",
     "      q, k, v, /*attn_mask=*/{},",
     "      q, k.repeat({1, heads / kv_heads, 1, 1}), v.repeat({1, heads / kv_heads, 1, 1}), {},",
     [HF, FSDP2]),
    ("rms-norm-eps-ignored", "examples/gpt/llama/rms_norm.cpp",
     "std::sqrt(mean_square + eps)", "std::sqrt(mean_square + 1e-6f)", [HF]),
    ("rms-norm-gradient-without-the-rms-term", "examples/gpt/llama/rms_norm.cpp",
     "dxr[i] = rs * (g[i] - (xr[i] * rs) * mean_g_xhat)", "dxr[i] = rs * g[i]", [FSDP2]),
    ("llama3-rope-scaling-ignored", "examples/gpt/llama/llama.cpp",
     "if (!config.rope_scaling) return inv_freq;", "return inv_freq;", [HF, FSDP2]),
    ("export-names-untranslated", "examples/gpt/hf_folder.cpp",
     "tensors.emplace_back(naming.file_name(name),", "tensors.emplace_back(name,", [HF]),
]


if __name__ == "__main__":
    text_mutations.main(MUTATIONS, ["gpt_train", "fsdprun"])
