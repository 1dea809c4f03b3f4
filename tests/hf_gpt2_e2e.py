"""Hugging Face GPT-2 in and out: a randomly initialised transformers
GPT2LMHeadModel saved with save_pretrained (one file, and sharded with its index) is loaded by
gpt_train --init-from-hf at W = 2, each rank reading only its shard; its loss and logits on a
fixed batch of token ids equal transformers' within 1e-5; the set-up peak per rank stays within
the sharded model plus the largest parameter; after training, --export-hf writes a folder that
GPT2LMHeadModel.from_pretrained loads with no missing or unexpected keys and whose logits equal
gpt_train's; nanoGPT's and llm.c's .bin layouts train alike; bad folders and token files fail with
named errors.

    hf_gpt2_e2e.py BIN_DIR"""
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is made here: nothing to download

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

from hf_checks import hf_loss_and_logits, refusal_failure, relative, run_gpt_train, write_tokens

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
VOCAB, SEQ = 1000, 32
TOL = 1e-5


def make_model(tmp):
    """A random GPT-2 whose biases and LayerNorms are random too (a name or transpose mistake
    cannot hide behind zeros and ones), saved as one file and as shards with an index."""
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64,
                        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.05)
    single, sharded = tmp / "single", tmp / "sharded"
    model.save_pretrained(single)
    model.save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").exists(), list(sharded.iterdir())
    assert len(list(sharded.glob("model-*.safetensors"))) > 2
    return model, single, sharded


def gpt_train(*args, n=2, check=True):
    return run_gpt_train(BIN, *args, n=n, check=check, timeout=240)


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def loads_like_transformers(model, folder, data, eval_bin, tmp, label, n=2, extra=()):
    """gpt_train at W = n loads `folder`: loss and logits on the eval batch equal transformers'."""
    out = tmp / f"eval-{label}.pt"
    gpt_train("--init-from-hf", str(folder), "--data-tokens", str(data), "--seq", str(SEQ),
              "--batch", "2", "--steps", "0", "--eval-tokens", str(eval_bin), "--eval-out",
              str(out), "--metrics", str(tmp / f"m-{label}-{{rank}}.jsonl"), *extra, n=n)
    ours = torch.load(out)
    loss, logits = hf_loss_and_logits(model, ours["inputs"], ours["targets"])
    rel = relative(ours["loss_initial"].item(), loss)
    diff = (ours["logits_initial"] - logits).abs().max().item()
    print(f"{label}: loss {ours['loss_initial'].item():.8f} vs transformers {loss:.8f} "
          f"(relative {rel:.2e}), logits max |diff| {diff:.2e}")
    assert rel <= TOL, f"{label}: loss differs by {rel:.2e} relative"
    assert torch.allclose(ours["logits_initial"], logits, rtol=TOL, atol=TOL), f"{label}: {diff}"
    return tmp / f"m-{label}-{{rank}}.jsonl"


def setup_within_bound(metrics_pattern, n=2):
    """Loading the shards stays within the sharded model + the largest parameter; building it
    (deferred) within the sharded model + the root unit's own parameters (wte, wpe, ln_f), which
    fully_shard_deferred holds whole until it shards the root."""
    for rank in range(n):
        s = read_jsonl(str(metrics_pattern).replace("{rank}", str(rank)))[0]
        assert s["setup"] == "init-from-hf", s
        over = s["setup_peak_bytes"] - s["setup_bound_bytes"]
        print(f"rank {rank}: set-up peak {s['setup_peak_bytes']} B (build {s['build_peak_bytes']}, "
              f"load {s['load_peak_bytes']}); bound {s['setup_bound_bytes']} = sharded "
              f"{s['sharded_model_bytes']} + largest {s['largest_param_bytes']}; "
              f"{'over' if over > 0 else 'under'} it by {abs(over)} B")
        assert 0 < s["load_peak_bytes"] <= s["setup_bound_bytes"], s
        assert 0 < s["build_peak_bytes"] <= s["sharded_model_bytes"] + s["root_unit_bytes"], s


def export_round_trip(folder, data, eval_bin, tmp):
    """Train, export, from_pretrained: no missing or unexpected keys, the same logits."""
    out, exported = tmp / "eval-trained.pt", tmp / "exported"
    gpt_train("--init-from-hf", str(folder), "--data-tokens", str(data), "--seq", str(SEQ),
              "--batch", "2", "--steps", "5", "--lr", "3e-3", "--eval-tokens", str(eval_bin),
              "--eval-out", str(out), "--export-hf", str(exported))
    ours = torch.load(out)
    assert relative(ours["loss_final"].item(), ours["loss_initial"].item()) > 1e-3, ours
    hf_logging.set_verbosity_error()
    model, info = GPT2LMHeadModel.from_pretrained(exported, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info.get("mismatched_keys"), info
    loss, logits = hf_loss_and_logits(model.eval(), ours["inputs"], ours["targets"])
    rel = relative(ours["loss_final"].item(), loss)
    diff = (ours["logits_final"] - logits).abs().max().item()
    print(f"exported after 5 steps: loss {ours['loss_final'].item():.8f} vs from_pretrained "
          f"{loss:.8f} (relative {rel:.2e}), logits max |diff| {diff:.2e}")
    assert rel <= TOL and torch.allclose(ours["logits_final"], logits, rtol=TOL, atol=TOL)
    return exported


def fresh_model_exports(data, eval_bin, tmp):
    """A model trained from scratch on token ids (--vocab, no --init-from-hf) exports too."""
    out, exported = tmp / "eval-fresh.pt", tmp / "fresh"
    gpt_train("--data-tokens", str(data), "--vocab", str(VOCAB), "--layers", "2", "--dim", "32",
              "--heads", "2", "--seq", str(SEQ), "--batch", "2", "--steps", "3", "--eval-tokens",
              str(eval_bin), "--eval-out", str(out), "--export-hf", str(exported))
    ours = torch.load(out)
    model, info = GPT2LMHeadModel.from_pretrained(exported, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.config.n_positions == SEQ and model.config.vocab_size == VOCAB, model.config
    with torch.no_grad():  # its context is --seq: the inputs alone, the loss computed here
        logits = model.eval()(input_ids=ours["inputs"]).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                             ours["targets"].reshape(-1)).item()
    assert relative(ours["loss_final"].item(), loss) <= TOL, (ours["loss_final"], loss)
    assert torch.allclose(ours["logits_final"], logits, rtol=TOL, atol=TOL)
    print(f"trained from scratch, exported: loss {loss:.8f} equal within {TOL}")


def token_layouts_agree(folder, tokens, tmp):
    """nanoGPT's raw .bin and llm.c's headed .bin of the same ids train to the same losses."""
    write_tokens(tmp / "llmc.bin", tokens, llmc_version=1)
    losses = []
    for name in ("train.bin", "llmc.bin"):
        gpt_train("--init-from-hf", str(folder), "--data", str(tmp / name), "--seq", str(SEQ),
                  "--batch", "2", "--steps", "2", "--metrics", str(tmp / f"{name}-{{rank}}.jsonl"))
        losses.append([r["loss"] for r in read_jsonl(tmp / f"{name}-0.jsonl") if "step" in r])
    assert losses[0] == losses[1] and len(losses[0]) == 2, losses
    print("nanoGPT and llm.c token files: the same losses", losses[0])


def bad_inputs(model, single, sharded, data, tmp):
    """Each bad folder or file: a non-zero exit naming the cause, at W = 2, no hang."""
    import shutil
    from safetensors.torch import save_file

    def folder(name, edit):
        target = tmp / name
        shutil.copytree(single, target)
        edit(target)
        return target

    def config_edit(**changes):
        def edit(target):
            config = json.loads((target / "config.json").read_text())
            config.update(changes)
            (target / "config.json").write_text(json.dumps(config))
        return edit

    def wrong_shape(target):
        state = {f"transformer.{k}": v.contiguous() for k, v in model.transformer.state_dict().items()
                 if not k.endswith(".attn.bias")}
        state["transformer.h.1.mlp.c_fc.weight"] = state["transformer.h.1.mlp.c_fc.weight"].t().contiguous()
        save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})

    def truncate(target):
        path = target / "model.safetensors"
        path.write_bytes(path.read_bytes()[:-100])

    missing_shard = tmp / "missing-shard"
    shutil.copytree(sharded, missing_shard)
    sorted(missing_shard.glob("model-*.safetensors"))[-1].unlink()
    write_tokens(tmp / "big-ids.bin", [5] * 500 + [VOCAB] + [5] * 500)

    base = ["--data-tokens", str(data), "--seq", str(SEQ), "--batch", "2", "--steps", "1"]
    cases = [
        ("--layers contradicts config.json", ["--init-from-hf", str(single), "--layers", "3"],
         ["--layers 3 contradicts", "n_layer 2"]),
        ("--seq longer than n_positions", ["--init-from-hf", str(single), "--seq", "65"],
         ["--seq 65", "n_positions 64"]),
        ("activation relu", ["--init-from-hf", str(folder("relu", config_edit(activation_function="relu")))],
         ["activation_function", "relu"]),
        ("untied head", ["--init-from-hf", str(folder("untied", config_edit(tie_word_embeddings=False)))],
         ["tie_word_embeddings"]),
        ("layer_norm_epsilon 1e-6", ["--init-from-hf", str(folder("eps", config_edit(layer_norm_epsilon=1e-6)))],
         ["layer_norm_epsilon"]),
        ("config says 3 layers, weights 2", ["--init-from-hf", str(folder("three", config_edit(n_layer=3)))],
         ["has no tensor 'h.2."]),
        ("missing shard of the index", ["--init-from-hf", str(missing_shard)],
         ["model.safetensors.index.json names", "does not exist"]),
        ("tensor of the wrong shape", ["--init-from-hf", str(folder("shape", wrong_shape))],
         ["transformer.h.1.mlp.c_fc.weight", "has shape [256, 64]", "needs [64, 256]"]),
        ("truncated model.safetensors", ["--init-from-hf", str(folder("truncated", truncate))],
         ["model.safetensors", "not a valid safetensors file"]),
        ("token id out of range", ["--init-from-hf", str(single), "--data-tokens", str(tmp / "big-ids.bin")],
         ["big-ids.bin", "token 500 is id 1000", "vocabulary of 1000"]),
        ("byte vocabulary, GPT-2 ids", ["--data-tokens", str(data), "--layers", "1", "--dim", "16",
                                        "--heads", "2"], ["outside the model's vocabulary of 256"]),
    ]
    failures = []
    for name, flags, needles in cases:
        args = list(base)
        for flag in flags[::2]:
            if flag in args:
                i = args.index(flag)
                del args[i:i + 2]
        failure = refusal_failure(name, gpt_train(*args, *flags, check=False), needles)
        if failure:
            failures.append(failure)
    assert not failures, "\n".join(failures)


def main():
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        model, single, sharded = make_model(tmp)
        rng = np.random.default_rng(1)
        tokens = rng.integers(0, VOCAB, 20000)
        write_tokens(tmp / "train.bin", tokens)
        write_tokens(tmp / "eval.bin", rng.integers(0, VOCAB, 4 * (SEQ + 1)))
        data, eval_bin = tmp / "train.bin", tmp / "eval.bin"
        metrics = loads_like_transformers(model, single, data, eval_bin, tmp, "one file, W=2")
        setup_within_bound(metrics)
        loads_like_transformers(model, sharded, data, eval_bin, tmp, "sharded index, W=2")
        loads_like_transformers(model, single, data, eval_bin, tmp, "one file, W=3", n=3)
        loads_like_transformers(model, single, data, eval_bin, tmp, "unsharded reference", n=0,
                                extra=["--reference"])
        export_round_trip(single, data, eval_bin, tmp)
        fresh_model_exports(data, eval_bin, tmp)
        token_layouts_agree(single, tokens, tmp)
        bad_inputs(model, single, sharded, data, tmp)
    print("hf_gpt2 end to end: ok")


if __name__ == "__main__":
    main()
