"""Hugging Face Qwen3 in and out: random transformers Qwen3ForCausalLM models (2 layers, hidden
64, 4 heads over 2 key/value heads, head_dim 32, not 64 / 4; q_norm, k_norm and the other norms
random), untied and tied, saved with save_pretrained, are loaded by gpt_train --init-from-hf:
- at W = 1 and W = 3 their logits on a fixed batch equal transformers' own forward within 1e-4,
  and --export-hf of the loaded model writes the files' tensors back bitwise (the round trip);
- trained 10 steps with FSDP (W = 2), the exported folder loads in Qwen3ForCausalLM with no
  missing or unexpected keys, holds gpt_train's --save-full bitwise, and its logits equal
  gpt_train's;
- trained 10 steps with --tp 2 (clipping on) against --reference: losses, gradient norms and the
  trained weights (q_norm's and k_norm's among them, replicated over the tp ranks, their gradients
  summed) agree; its export loads in transformers with gpt_train's logits.
--model qwen3 from flags (--head-dim apart from dim/heads) trains under every strategy (full,
grad_op, hybrid, none) and with --optimizer muon as --reference does; what gpt_train cannot
represent (a sliding window shorter than --seq, attention biases, an odd head_dim, sliding layers
without a window) and flags of another family are refused by name.

    hf_qwen3_e2e.py BIN_DIR"""
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is made here: nothing to download

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

from hf_checks import hf_loss_and_logits, refusal_failure, relative, run_gpt_train, write_tokens

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
VOCAB, SEQ, STEPS = 512, 32, 10
TOL = 1e-4  # logits against transformers (seen: ~1e-6)
# --tp 2 against --reference (tests/tp_parity_e2e.py's): the loss (first step, later), the gradient
# norm before clipping (--clip 0.05 binds), the trained tensors' relative difference; q_norm's and
# k_norm's (seen: 1.8e-7; with their gradients not summed over the tp ranks 8e-3) tighter.
LOSS_TOL, NORM_TOL, TENSOR_TOL, HEAD_NORM_TOL = (5e-5, 1e-4), 1e-4, 1e-3, 1e-5
TRAIN = ["--seq", SEQ, "--batch", 2, "--steps", STEPS, "--lr", "3e-3"]


def qwen3(tmp, tied, seed):
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
                         rms_norm_eps=1e-6, tie_word_embeddings=tied,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():  # norms random too: a swapped or skipped norm cannot hide behind ones
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.empty_like(p).uniform_(0.5, 1.5))
    folder = tmp / ("tied" if tied else "untied")
    model.save_pretrained(folder)
    return model.eval(), folder


def gpt_train(*args, n=2, check=True):
    return run_gpt_train(BIN, *args, n=n, check=check)


def logits_difference(model, ours, which, label):
    """gpt_train's loss and logits (`which`: initial or final) against transformers' forward."""
    loss, logits = hf_loss_and_logits(model, ours["inputs"], ours["targets"])
    mine, my_logits = ours[f"loss_{which}"].item(), ours[f"logits_{which}"]
    rel, diff = relative(mine, loss), (my_logits - logits).abs().max().item()
    print(f"{label}: loss {mine:.8f} vs transformers {loss:.8f} (relative {rel:.2e}), "
          f"logits max |diff| {diff:.2e}")
    assert rel <= TOL, f"{label}: loss differs by {rel:.2e} relative"
    assert diff <= TOL, f"{label}: logits differ by {diff:.2e}"


def same_files(exported, source, label):
    """The folder's tensors, name by name, bitwise."""
    got, want = load_file(exported / "model.safetensors"), load_file(source / "model.safetensors")
    assert sorted(got) == sorted(want), f"{label}: names differ: {sorted(set(got) ^ set(want))}"
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), f"{label}: {name} differs"
    print(f"{label}: {len(want)} tensors written back bitwise")


def loads_and_writes_back(model, folder, data, eval_bin, tmp, label, n):
    """gpt_train at W = n loads `folder` (its logits are transformers') and exports it unchanged."""
    out, exported = tmp / f"eval-{label}-{n}.pt", tmp / f"back-{label}-{n}"
    gpt_train("--init-from-hf", folder, "--data-tokens", data, "--seq", SEQ, "--batch", 2, "--steps", 0,
              "--eval-tokens", eval_bin, "--eval-out", out, "--export-hf", exported, n=n)
    logits_difference(model, torch.load(out), "initial", f"{label}, W={n}")
    same_files(exported, folder, f"{label}, W={n}, --export-hf of the loaded model")
    reread = Qwen3ForCausalLM.from_pretrained(exported).config
    assert reread.head_dim == 32 and reread.tie_word_embeddings == model.config.tie_word_embeddings


def file_names(state):
    """--save-full's names (the model's) as the folder's (transformers')."""
    names = {"wte.weight": "model.embed_tokens.weight", "ln_f.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
    parts = [("ln_1.", "input_layernorm."), ("ln_2.", "post_attention_layernorm."), ("attn.ln_q.", "self_attn.q_norm."),
             ("attn.ln_k.", "self_attn.k_norm."), ("attn.", "self_attn."), ("mlp.", "mlp.")]
    out = {}
    for name, tensor in state.items():
        if name in names:
            out[names[name]] = tensor
            continue
        _, layer, rest = name.split(".", 2)
        mine, theirs = next(p for p in parts if rest.startswith(p[0]))
        out[f"model.layers.{layer}.{theirs}{rest[len(mine):]}"] = tensor
    return out


def exported_holds(exported, full, label):
    """from_pretrained(exported): no missing or unexpected keys, gpt_train's --save-full bitwise."""
    model, info = Qwen3ForCausalLM.from_pretrained(exported, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info.get("mismatched_keys"), info
    theirs = model.state_dict()
    for name, tensor in file_names(torch.load(full)).items():
        assert torch.equal(theirs[name], tensor), f"{label}: {name} of the export differs from --save-full"
    return model


def exported_is_trained_model(exported, full, ours, label, moved_at_least=1e-2):
    """exported_holds, and the model's logits are gpt_train's final ones."""
    model = exported_holds(exported, full, label)
    moved = (ours["logits_final"] - ours["logits_initial"]).abs().max().item()
    assert moved > moved_at_least, f"{label}: training did not change the logits (max change {moved})"
    logits_difference(model.eval(), ours, "final", f"{label}, exported, from_pretrained")


def trains_with_fsdp(folder, data, eval_bin, tmp):
    out, exported, full = tmp / "eval-fsdp.pt", tmp / "fsdp-hf", tmp / "fsdp.pt"
    gpt_train("--init-from-hf", folder, "--data-tokens", data, *TRAIN, "--eval-tokens", eval_bin,
              "--eval-out", out, "--export-hf", exported, "--save-full", full)
    exported_is_trained_model(exported, full, torch.load(out), f"{folder.name}, {STEPS} FSDP steps at W=2")


def steps(path):
    return [r for r in map(json.loads, Path(path).read_text().splitlines()) if "step" in r]


def same_run(mine, reference, label, loss_tol=LOSS_TOL, norm_tol=NORM_TOL):
    """Two --metrics files: the same steps, losses and (when clipping) gradient norms."""
    got, want = steps(mine), steps(reference)
    assert len(got) == len(want) > 0, f"{label}: {len(got)} steps vs {len(want)}"
    worst = 0.0
    for s, (a, b) in enumerate(zip(got, want)):
        error = relative(a["loss"], b["loss"])
        worst = max(worst, error)
        assert error <= loss_tol[s > 0], f"{label} step {s + 1}: loss {a['loss']} vs {b['loss']} ({error:.2e})"
        if "grad_norm" in b:
            error = relative(a["grad_norm"], b["grad_norm"])
            assert error <= norm_tol, f"{label} step {s + 1}: gradient norm {a['grad_norm']} vs {b['grad_norm']} ({error:.2e})"
    return worst


def trains_with_tensor_parallelism(folder, data, tmp):
    """--tp 2 (dp 1) against --reference on the same batches: q_norm and k_norm are replicated and
    each rank norms its own heads, so their gradients are each rank's part of the sum."""
    clip = ["--clip", 0.05]
    ref, ref_full = tmp / "ref.jsonl", tmp / "ref.pt"
    gpt_train("--reference", "--world-size", 1, "--init-from-hf", folder, "--data-tokens", data, *TRAIN, *clip,
              "--metrics", ref, "--save-full", ref_full, n=0)
    exported, full = tmp / "tp-hf", tmp / "tp.pt"
    gpt_train("--tp", 2, "--init-from-hf", folder, "--data-tokens", data, *TRAIN, *clip,
              "--metrics", tmp / "tp-{rank}.jsonl", "--save-full", full, "--export-hf", exported)
    mine, want = torch.load(full), torch.load(ref_full)
    assert sorted(mine) == sorted(want)
    initial = load_file(folder / "model.safetensors")
    differences = {}
    for name, tensor in sorted(want.items(), key=lambda item: ".ln_q." not in item[0] and ".ln_k." not in item[0]):
        differences[name] = ((mine[name].double() - tensor).norm() / tensor.double().norm()).item()
        head_norm = ".ln_q." in name or ".ln_k." in name
        assert differences[name] <= (HEAD_NORM_TOL if head_norm else TENSOR_TOL), \
            f"--tp 2 {name}: relative difference {differences[name]:.3e} from --reference"
        assert not torch.equal(tensor, initial[file_name_of(name)]), f"{name} did not train"
    norms = max(v for k, v in differences.items() if ".ln_q." in k or ".ln_k." in k)
    worst = max(same_run(tmp / f"tp-{rank}.jsonl", ref, f"--tp 2 rank {rank}") for rank in (0, 1))
    print(f"--tp 2, {STEPS} steps, tied head: worst relative loss difference {worst:.2e} from --reference; "
          f"trained weights within {max(differences.values()):.2e} relative (q_norm/k_norm {norms:.2e})")
    exported_holds(exported, full, f"{folder.name}, {STEPS} steps with --tp 2")


def file_name_of(name):
    return next(iter(file_names({name: None})))


def trains_from_flags(data, eval_bin, tmp):
    """--model qwen3 with --head-dim 16 (dim 32 / 4 heads is 8): every strategy at W = 2, and Muon,
    the same losses as --reference; exported (a config.json of its own), Qwen3ForCausalLM loads it."""
    model = ["--model", "qwen3", "--vocab", VOCAB, "--layers", 2, "--dim", 32, "--heads", 4, "--kv-heads", 2,
             "--head-dim", 16, "--ffn-dim", 48, "--seq", SEQ, "--batch", 2, "--steps", 3, "--lr", "3e-3"]
    ran = []
    for optimizer in ("fused", "muon"):
        ref = tmp / f"flags-ref-{optimizer}.jsonl"
        gpt_train("--reference", "--world-size", 2, "--data-tokens", data, *model, "--optimizer", optimizer,
                  "--metrics", ref, n=0)
        strategies = (["full", "grad_op", "hybrid", "none"] if optimizer == "fused" else ["full"])
        for strategy in strategies:
            extra = ["--shard-group-size", 1] if strategy == "hybrid" else []
            exported, full, evaluated = tmp / "flags-hf", tmp / "flags.pt", tmp / "eval-flags.pt"
            if (strategy, optimizer) == ("full", "fused"):
                extra += ["--export-hf", exported, "--save-full", full, "--eval-tokens", eval_bin, "--eval-out", evaluated]
            out = tmp / f"flags-{optimizer}-{strategy}-0.jsonl"
            gpt_train("--data-tokens", data, *model, "--optimizer", optimizer, "--strategy", strategy, *extra,
                      "--metrics", str(out).replace("-0.jsonl", "-{rank}.jsonl"))
            if (strategy, optimizer) == ("full", "fused"):
                exported_is_trained_model(exported, full, torch.load(evaluated), "--model qwen3 from flags",
                                          moved_at_least=1e-4)
                config = json.loads((exported / "config.json").read_text())
                assert config["architectures"] == ["Qwen3ForCausalLM"] and config["head_dim"] == 16, config
            # Muon's Newton-Schulz runs in bf16 (tests/tp_parity_e2e.py's tolerance).
            worst = same_run(out, ref, f"--strategy {strategy} --optimizer {optimizer}",
                             loss_tol=(5e-5, 2e-4) if optimizer == "muon" else LOSS_TOL)
            ran.append(f"{strategy}/{optimizer} {worst:.1e}")
    print(f"--model qwen3 from flags (--head-dim 16), 3 steps at W=2 against --reference: {', '.join(ran)}")


def edited(source, target, **changes):
    """A copy of the folder `source` whose config.json has `changes` (None removes a key)."""
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    (target / "config.json").write_text(json.dumps(config))
    return target


def bad_inputs(untied, data, tmp):
    def folder(name, **changes):
        return edited(untied, tmp / "bad" / name, **changes)

    base = ["--data-tokens", data, "--seq", SEQ, "--batch", 2, "--steps", 1]
    cases = [
        ("--seq past the sliding layers' window (layer_types)",
         [folder("window", use_sliding_window=True, sliding_window=16,
                 layer_types=["full_attention", "sliding_attention"])],
         ["--seq 32 is longer than", "sliding_window 16", "--seq 16 or less"]),
        ("--seq past the sliding layers' window (max_window_layers)",
         [folder("window-from", use_sliding_window=True, sliding_window=16, max_window_layers=1, layer_types=None)],
         ["--seq 32 is longer than", "sliding_window 16", "--seq 16 or less"]),
        ("sliding layers without a window", [folder("no-window", layer_types=["full_attention", "sliding_attention"])],
         ["layer_types", "use_sliding_window"]),
        ("attention bias", [folder("bias", attention_bias=True)], ["attention_bias"]),
        ("an odd head_dim", [folder("odd", head_dim=31)], ["head_dim 31 is odd"]),
        ("head_dim absent: Qwen3Config's 128, not the weights' 32", [folder("no-head-dim", head_dim=None)],
         ["h.0.attn.q_proj.weight", "[512, 64]"]),
        ("--model llama for a Qwen3", [untied, "--model", "llama"], ["--model llama contradicts", "--model qwen3"]),
        ("--head-dim with --init-from-hf", [untied, "--head-dim", "16"], ["--head-dim contradicts"]),
    ]
    failures = [refusal_failure(name, gpt_train(*base, "--init-from-hf", *flags, check=False), needles)
                for name, flags, needles in cases]
    llama = gpt_train("--model", "llama", "--data-tokens", data, "--vocab", VOCAB, "--head-dim", 16, "--steps", 1,
                      check=False)
    failures.append(refusal_failure("--head-dim with --model llama", llama, ["--head-dim applies to --model qwen3"]))
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures)


def main():
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="hf_qwen3_") as name:
        tmp = Path(name)
        rng = np.random.default_rng(1)
        write_tokens(tmp / "train.bin", rng.integers(0, VOCAB, 20000))
        write_tokens(tmp / "eval.bin", rng.integers(0, VOCAB, 4 * (SEQ + 1)))
        data, eval_bin = tmp / "train.bin", tmp / "eval.bin"
        untied, untied_folder = qwen3(tmp, tied=False, seed=0)
        tied, tied_folder = qwen3(tmp, tied=True, seed=1)
        for model, folder in ((untied, untied_folder), (tied, tied_folder)):
            for n in (1, 3):
                loads_and_writes_back(model, folder, data, eval_bin, tmp, folder.name, n)
        trains_with_fsdp(untied_folder, data, eval_bin, tmp)
        trains_with_tensor_parallelism(tied_folder, data, tmp)
        trains_from_flags(data, eval_bin, tmp)
        bad_inputs(untied_folder, data, tmp)
    print("hf_qwen3 end to end: ok")


if __name__ == "__main__":
    main()
