"""Hugging Face Llama in and out: random transformers models of the Llama family, saved with
save_pretrained, are loaded by gpt_train --init-from-hf at W = 2 (each rank reading only its
shard) and their loss and logits on a fixed batch of token ids equal transformers' own forward
within fp32 rounding:
- a Llama 3 with grouped-query attention (2 key/value heads for 4 heads), an untied head and
  Llama 3's rope scaling (rope_type "llama3"), as one file and as shards with an index;
- a tied-head Llama written as transformers 4.x spells RoPE (rope_theta + rope_scaling);
- a Qwen2 (biases on q, k and v).
After training, --export-hf writes a folder that LlamaForCausalLM.from_pretrained loads with no
missing or unexpected keys and whose logits equal gpt_train's. What the model cannot represent
(another rope type, activation or attention bias, kv heads that do not divide the heads, a --seq
past a Mistral's sliding window) fails with a message naming the key.

    hf_llama_e2e.py BIN_DIR"""
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is made here: nothing to download

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)
from transformers.utils import logging as hf_logging

from hf_checks import hf_loss_and_logits, refusal_failure, relative, run_gpt_train, write_tokens

BIN = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("build/bin")
VOCAB, SEQ = 512, 32
TOL = 1e-5
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def randomize_norms(model):
    """Norms (and biases) random too, so that a name mistake cannot hide behind ones and zeros."""
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.empty_like(p).uniform_(0.5, 1.5))
    return model.eval()


def llama3(tmp):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, rope_parameters=dict(LLAMA3_ROPE))
    model = randomize_norms(LlamaForCausalLM(config))
    single, sharded = tmp / "llama3", tmp / "llama3-sharded"
    model.save_pretrained(single)
    model.save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").exists(), list(sharded.iterdir())
    return model, single, sharded


def tied_llama_4x_spelling(tmp):
    """A tied head, and config.json as transformers 4.x writes RoPE: rope_theta and rope_scaling."""
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=64,
                         rms_norm_eps=1e-6, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model = randomize_norms(LlamaForCausalLM(config))
    folder = tmp / "tied"
    model.save_pretrained(folder)
    path = folder / "config.json"
    written = json.loads(path.read_text())
    written.pop("rope_parameters", None)
    written.update(rope_theta=10000.0, rope_scaling=None)
    path.write_text(json.dumps(written))
    return model, folder


def qwen2(tmp):
    torch.manual_seed(2)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False)
    model = randomize_norms(Qwen2ForCausalLM(config))
    folder = tmp / "qwen2"
    model.save_pretrained(folder)
    return model, folder


def gpt_train(*args, n=2, check=True):
    return run_gpt_train(BIN, *args, n=n, check=check)


def same_as_transformers(model, ours, which, label):
    loss, logits = hf_loss_and_logits(model, ours["inputs"], ours["targets"])
    mine, my_logits = ours[f"loss_{which}"].item(), ours[f"logits_{which}"]
    rel, diff = relative(mine, loss), (my_logits - logits).abs().max().item()
    print(f"{label}: loss {mine:.8f} vs transformers {loss:.8f} (relative {rel:.2e}), "
          f"logits max |diff| {diff:.2e}")
    assert rel <= TOL, f"{label}: loss differs by {rel:.2e} relative"
    assert torch.allclose(my_logits, logits, rtol=TOL, atol=TOL), f"{label}: logits differ by {diff}"


def loads_like_transformers(model, folder, data, eval_bin, tmp, label, n=2):
    """gpt_train at W = n loads `folder`: loss and logits on the eval batch equal transformers'."""
    out = tmp / f"eval-{len(list(tmp.glob('eval-*')))}.pt"
    gpt_train("--init-from-hf", folder, "--data-tokens", data, "--seq", SEQ, "--batch", 2,
              "--steps", 0, "--eval-tokens", eval_bin, "--eval-out", out, n=n)
    same_as_transformers(model, torch.load(out), "initial", label)


def export_round_trip(folder, data, eval_bin, tmp):
    """Train, export, from_pretrained: no missing or unexpected keys, the same logits."""
    out, exported = tmp / "eval-trained.pt", tmp / "exported"
    gpt_train("--init-from-hf", folder, "--data-tokens", data, "--seq", SEQ, "--batch", 2,
              "--steps", 4, "--lr", "3e-3", "--eval-tokens", eval_bin, "--eval-out", out,
              "--export-hf", exported)
    ours = torch.load(out)
    moved = (ours["logits_final"] - ours["logits_initial"]).abs().max().item()
    assert moved > 1e-2, f"training did not change the model's logits (max change {moved})"
    model, info = LlamaForCausalLM.from_pretrained(exported, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info.get("mismatched_keys"), info
    assert model.config.num_key_value_heads == 2 and not model.config.tie_word_embeddings
    assert model.config.rope_parameters["rope_type"] == "llama3", model.config.rope_parameters
    same_as_transformers(model.eval(), ours, "final", "exported after 4 steps, from_pretrained")


def fresh_model_exports(data, eval_bin, tmp):
    """A Llama built from flags (--model llama, no --init-from-hf) trains and exports too."""
    out, exported = tmp / "eval-fresh.pt", tmp / "fresh"
    gpt_train("--model", "llama", "--data-tokens", data, "--vocab", VOCAB, "--layers", 2, "--dim", 32,
              "--heads", 4, "--kv-heads", 1, "--ffn-dim", 48, "--rope-theta", 5e5, "--seq", SEQ,
              "--batch", 2, "--steps", 2, "--eval-tokens", eval_bin, "--eval-out", out,
              "--export-hf", exported)
    model, info = LlamaForCausalLM.from_pretrained(exported, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.config.num_key_value_heads == 1 and model.config.intermediate_size == 48
    same_as_transformers(model.eval(), torch.load(out), "final", "--model llama from flags, exported")


def uint32_token_files(tmp):
    """llm.c's version-2 files (uint32 ids, Llama 3's): the same ids train as in a uint16 file,
    and ids past 65535 train a vocabulary of 70,000."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, VOCAB, 5000)
    write_tokens(tmp / "v1.bin", ids, llmc_version=1)
    write_tokens(tmp / "v2.bin", ids, llmc_version=2)
    model = ["--reference", "--model", "llama", "--layers", 1, "--dim", 16, "--heads", 2, "--seq", 16,
             "--batch", 2, "--steps", 2]
    losses = []
    for name in ("v1", "v2"):
        gpt_train(*model, "--vocab", VOCAB, "--data-tokens", tmp / f"{name}.bin",
                  "--metrics", tmp / f"{name}.jsonl", n=0)
        records = [json.loads(line) for line in (tmp / f"{name}.jsonl").read_text().splitlines()]
        losses.append([r["loss"] for r in records if "step" in r])
    assert losses[0] == losses[1] and len(losses[0]) == 2, losses
    write_tokens(tmp / "big.bin", rng.integers(60000, 70000, 5000), llmc_version=2)
    gpt_train(*model, "--vocab", 70000, "--data-tokens", tmp / "big.bin", n=0)
    print(f"llm.c version 2 (uint32 ids): the same losses as version 1 {losses[0]}; ids 60000-69999 train")


def edited(source, target, **changes):
    """A copy of the folder `source` whose config.json has `changes` (None removes a key)."""
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    (target / "config.json").write_text(json.dumps(config))
    return target


def transformers_readings(single, data, eval_bin, tmp):
    """Folders that transformers 5 reads in its own way, each loaded by from_pretrained itself as
    the reference: a config that ties the head beside a file with a head of its own (loaded
    untied), an empty rope_scaling beside rope_parameters (ignored), and
    original_max_position_embeddings at the top level and in rope_parameters (the top level's)."""
    rope = {**LLAMA3_ROPE, "rope_theta": 20000.0}
    cases = [
        ("tie_word_embeddings true beside the file's own lm_head",
         edited(single, tmp / "own-head", tie_word_embeddings=True)),
        ("rope_scaling {} beside rope_parameters",
         edited(single, tmp / "empty-scaling", rope_scaling={}, rope_parameters=rope)),
        ("original_max_position_embeddings 64 at the top, 16 in rope_parameters",
         edited(single, tmp / "two-omp", original_max_position_embeddings=64)),
    ]
    for label, folder in cases:
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        loads_like_transformers(model, folder, data, eval_bin, tmp, label)
    model = AutoModelForCausalLM.from_pretrained(cases[0][1])
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    exported = tmp / "own-head-exported"
    gpt_train("--init-from-hf", cases[0][1], "--data-tokens", data, "--seq", SEQ, "--batch", 2,
              "--steps", 0, "--export-hf", exported)
    back = load_file(exported / "model.safetensors")
    assert torch.equal(back["lm_head.weight"], model.lm_head.weight), "the export lost the own head"
    print("own head: exported untied, the file's lm_head kept")


def export_onto_a_sharded_folder(single, sharded, data, tmp):
    """--export-hf where a sharded model was saved: the old index and the shards it names go, a
    file it does not name stays, and an fp32 export carries no quantization_config."""
    target = tmp / "onto-sharded"
    shutil.copytree(sharded, target)
    (target / "README.md").write_text("kept")
    source = edited(single, tmp / "quantized", quantization_config={"quant_method": "bitsandbytes"})
    gpt_train("--init-from-hf", source, "--data-tokens", data, "--seq", SEQ, "--batch", 2,
              "--steps", 0, "--export-hf", target)
    left = sorted(p.name for p in target.iterdir())
    assert left == ["README.md", "config.json", "generation_config.json", "model.safetensors"], left
    assert "quantization_config" not in json.loads((target / "config.json").read_text())
    model, info = LlamaForCausalLM.from_pretrained(target, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    print(f"export onto a sharded folder: {left}, no quantization_config")


def with_a_second_copy(sharded, target, same):
    """The sharded folder with model.norm.weight also in another shard than the index names."""
    shutil.copytree(sharded, target)
    index = json.loads((target / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.norm.weight"
    other = next(f for f in sorted(set(index.values())) if f != index[name])
    value = load_file(target / index[name])[name]
    tensors = load_file(target / other)
    tensors[name] = value if same else value * 3
    save_file(tensors, target / other, metadata={"format": "pt"})
    return target


def transformers_refuses(folder):
    try:
        AutoModelForCausalLM.from_pretrained(folder)
    except Exception as e:  # noqa: BLE001  (KeyError, ValueError: whichever it raises)
        return f"{type(e).__name__}: {str(e)[:80]}"
    raise AssertionError(f"transformers loads {folder}; gpt_train must not refuse it")


def bad_inputs(single, sharded, data, tmp):
    def folder(name, **changes):
        return edited(single, tmp / "bad" / name, **changes)

    no_factor = folder("no-factor", rope_parameters={k: v for k, v in LLAMA3_ROPE.items() if k != "factor"})
    per_layer = folder("per-layer", model_type="qwen2", rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e4},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e3}})
    for refused_too in (no_factor, per_layer):
        print(f"transformers refuses {refused_too.name}: {transformers_refuses(refused_too)}")
    same = with_a_second_copy(sharded, tmp / "bad" / "same-copy", same=True)
    loads_like_transformers(AutoModelForCausalLM.from_pretrained(same).eval(), same, data,
                            tmp / "eval.bin", tmp, "a tensor in two shards, equal copies")

    base = ["--data-tokens", data, "--seq", SEQ, "--batch", 2, "--steps", 1]
    cases = [
        ("rope type yarn", [folder("yarn", rope_parameters={**LLAMA3_ROPE, "rope_type": "yarn"})],
         ["rope_type", "yarn", "llama3"]),
        ("gelu MLP", [folder("gelu", hidden_act="gelu")], ["hidden_act", "silu"]),
        ("attention bias", [folder("bias", attention_bias=True)], ["attention_bias"]),
        ("kv heads not dividing", [folder("kv", num_key_value_heads=3)],
         ["num_key_value_heads 3", "num_attention_heads 4"]),
        ("--seq past a Mistral's sliding window", [folder("window", model_type="mistral", sliding_window=16)],
         ["--seq 32 is longer than", "sliding_window 16", "--seq 16 or less"]),
        ("a Mistral's window with use_sliding_window false (transformers' Mistral windows anyway)",
         [folder("window-off", model_type="mistral", sliding_window=16, use_sliding_window=False)],
         ["--seq 32 is longer than", "sliding_window 16"]),
        ("llama3 rope without factor", [no_factor], ["config.json", '"factor"', "llama3"]),
        ("Qwen2 per-layer rope_parameters", [per_layer], ["config.json", "per-layer", "full_attention"]),
        ("a tensor in two shards, other values",
         [with_a_second_copy(sharded, tmp / "bad" / "other-copy", same=False)],
         ["model.norm.weight", "other values", "model.safetensors.index.json"]),
        ("config says 4 layers, weights 3", [folder("four", num_hidden_layers=4)],
         ["has no tensor 'h.3.", "model.layers.3."]),
        ("--model gpt2 for a Llama", [single, "--model", "gpt2"], ["--model gpt2 contradicts", "--model llama"]),
        ("--kv-heads with --init-from-hf", [single, "--kv-heads", "1"], ["--kv-heads contradicts"]),
    ]
    failures = [refusal_failure(name, gpt_train(*base, "--init-from-hf", *flags, check=False), needles)
                for name, flags, needles in cases]
    flag_only = gpt_train("--data-tokens", data, "--vocab", VOCAB, "--kv-heads", 2, "--steps", 1,
                          check=False)
    failures.append(refusal_failure("--kv-heads without --model llama", flag_only,
                                    ["--kv-heads applies to --model llama"]))
    failures = [f for f in failures if f]
    assert not failures, "\n".join(failures)


def main():
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="hf_llama_") as name:
        tmp = Path(name)
        rng = np.random.default_rng(1)
        write_tokens(tmp / "train.bin", rng.integers(0, VOCAB, 20000))
        write_tokens(tmp / "eval.bin", rng.integers(0, VOCAB, 4 * (SEQ + 1)))
        data, eval_bin = tmp / "train.bin", tmp / "eval.bin"
        model, single, sharded = llama3(tmp)
        loads_like_transformers(model, single, data, eval_bin, tmp, "Llama 3 GQA, one file, W=2")
        loads_like_transformers(model, sharded, data, eval_bin, tmp, "Llama 3 GQA, sharded index, W=2")
        loads_like_transformers(model, single, data, eval_bin, tmp, "Llama 3 GQA, W=3", n=3)
        tied, tied_folder = tied_llama_4x_spelling(tmp)
        loads_like_transformers(tied, tied_folder, data, eval_bin, tmp, "tied head, 4.x RoPE keys, W=2")
        qwen, qwen_folder = qwen2(tmp)
        loads_like_transformers(qwen, qwen_folder, data, eval_bin, tmp, "Qwen2 (q/k/v biases), W=2")
        transformers_readings(single, data, eval_bin, tmp)
        export_round_trip(single, data, eval_bin, tmp)
        export_onto_a_sharded_folder(single, sharded, data, tmp)
        fresh_model_exports(data, eval_bin, tmp)
        uint32_token_files(tmp)
        bad_inputs(single, sharded, data, tmp)
    print("hf_llama end to end: ok")


if __name__ == "__main__":
    main()
