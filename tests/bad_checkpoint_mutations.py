#!/usr/bin/env python3
"""Does tests/bad_checkpoint_table.py catch what it claims? The checks that make sense of a
checkpoint (src/io/checkpoint_*.cpp, examples/gpt/checkpointing.cpp) and of outputs that cannot be
written (examples/gpt/options.h and its callers), each disabled in turn, as
tests/bad_files_mutations.py does for its table (the same runner, the same rules), with
checkpoint_tool and checkpoint_state_tool rebuilt too.

    .venv/bin/python tests/bad_checkpoint_mutations.py WORKTREE"""
import sys
from pathlib import Path

# (id, file, exact original text, mutated text, [cases that must turn red])
CHECKPOINT_MUTATIONS = [
    [
        ("metrics-write-unchecked", "examples/gpt/trainer.cpp",
         "TORCH_CHECK(metrics_.good(), ", "TORCH_CHECK(true, ",
         ["--metrics /dev/full", "--metrics on a full tmpfs"]),
        ("output-flag-unnamed", "examples/gpt/options.h",
         "TORCH_CHECK(false, output_failed(flag, path, fsdp::message_of(e)));", "throw;",
         ["--trace on a full tmpfs", "--dump-batches on a full tmpfs",
          "--save-full on a full tmpfs (W=2)"]),
        ("extra-field-missing-unchecked", "examples/gpt/checkpointing.cpp",
         "TORCH_CHECK(extra.is_object() && extra.contains(field),", "TORCH_CHECK(true,",
         ["extra.step missing", "extra.seed missing"]),
        ("extra-range-unchecked", "examples/gpt/checkpointing.cpp",
         "TORCH_CHECK(in_range, ", "TORCH_CHECK(true, ",
         ["extra.step -2", "extra.step a string", "extra.seed -1"]),
        ("extra-step-folder-unchecked", "examples/gpt/checkpointing.cpp",
         "TORCH_CHECK(named < 0 || named == step,", "TORCH_CHECK(true,",
         ["extra.step 3 in folder step-00000002"]),
        ("adamw-state-missing-accepted", "examples/gpt/checkpointing.cpp",
         "TORCH_CHECK(!optimizer_stepped || is_frozen(o, name), ", "TORCH_CHECK(true, ",
         ["no AdamW state for any parameter"]),
        ("adamw-step-range-unchecked", "examples/gpt/checkpointing.cpp",
         "TORCH_CHECK(adamw.is_number_integer() && ", "TORCH_CHECK(true || ",
         ["AdamW step 3 at extra.step 2"]),
        ("moments-nonfinite-accepted", "src/io/checkpoint_load.cpp",
         "TORCH_CHECK(at::isfinite(moment).all().item<bool>(), ", "TORCH_CHECK(true, ",
         ["+inf in an exp_avg_sq", "NaN in an exp_avg"]),
        ("box-shape-unchecked", "src/io/checkpoint_read.cpp",
         "TORCH_CHECK(boxes.size() == 1 && boxes[0].sizes == entry.shape, ",
         "TORCH_CHECK(boxes.size() == 1, ",
         ["a box's shape flattened in its header"]),
        ("reset-optimizer-keeps-state", "examples/gpt/checkpointing.cpp",
         "    optimizer.state().clear();\n", "",
         ["--reset-optimizer, complete checkpoint: AdamW afresh"]),
    ],
    [
        ("save-full-backtrace", "src/io/state_dict.cpp",
         "error = message_of(e);", "error = e.what();",
         ["--save-full on a full tmpfs (W=2)"]),
        ("export-hf-backtrace", "examples/gpt/checkpointing.cpp",
         "error = fsdp::message_of(e);", "error = e.what();",
         ["--export-hf on a full tmpfs (W=2)"]),
        ("box-offsets-unchecked", "src/io/checkpoint_read.cpp",
         "TORCH_CHECK(offsets == nlohmann::json(boxes[0].offsets), ", "TORCH_CHECK(true, ",
         ["DCP_SHARDING_INFO offsets shifted"]),
        ("moment-missing-blamed-on-amsgrad", "src/io/checkpoint_load.cpp",
         "TORCH_CHECK(!options_differ || added_by != optimizers::AddedBy::Amsgrad, ", "TORCH_CHECK(false, ",
         ["exp_avg_sq left out of optimizer_moments"]),
        ("adamw-step-negative-accepted", "src/io/checkpoint_format.cpp",
         "TORCH_CHECK(!param.step || *param.step >= 0, ", "TORCH_CHECK(true, ",
         ["checkpoint_tool, AdamW step -1"]),
        ("checkpoint-tool-step-unchecked", "tests/checkpoint_tool.cpp",
         "step = gpt::saved_step(fsdp::load_sharded(model, *optim, path), path + \"/metadata.json\");",
         "step = fsdp::load_sharded(model, *optim, path).at(\"step\").get<int64_t>();",
         ["checkpoint_tool, no extra.step"]),
        ("reset-optimizer-without-resume", "examples/gpt/command_line.cpp",
         "  if (o.reset_optimizer && !o.resume) {", "  if (false) {",
         ["--reset-optimizer without --resume"]),
    ],
    [
        ("skipped-steps-state-demanded", "examples/gpt/checkpointing.cpp",
         "TORCH_CHECK(!optimizer_stepped || is_frozen(o, name), ", "TORCH_CHECK(is_frozen(o, name), ",
         ["fp16, every step skipped: --resume without AdamW state"]),
    ],
    # A model's buffers and any optimizer's state (tests/checkpoint_state_tool.cpp's rows).
    [
        ("buffer-crc-unchecked", "src/io/checkpoint_read.cpp",
         "TORCH_CHECK(actual == saved.crc32, ", "TORCH_CHECK(true, ",
         ["buffer bytes altered (CRC-32 mismatch)"]),
        ("buffers-unmatched", "src/io/checkpoint_format.cpp",
         '    saved_like(saved, b, "buffer", source);\n', "",
         ["buffer missing from the checkpoint", "buffer of another shape",
          "buffer of another dtype (int64 count saved as double)"]),
        ("extra-buffer-unnamed", "src/io/checkpoint_format.cpp",
         "TORCH_CHECK(known.count(b.name), ", "TORCH_CHECK(true, ",
         ["a buffer the model does not have"]),
        ("other-optimizer-accepted", "src/io/checkpoint_load.cpp",
         "TORCH_CHECK(!any_state || meta.optimizer == mine, ", "TORCH_CHECK(true, ",
         ["saved with SGD (momentum), resumed with AdamW",
          "saved with AdamW, resumed with SGD (momentum)",
          "metadata.json names Adam: another optimizer's checkpoint"]),
        ("stateless-parameter-unchecked", "src/io/checkpoint_format.cpp",
         "  check_stateless_pieces(meta, source);\n", "",
         ["momentum_buffer left out of one parameter's optimizer_moments"]),
        ("listed-tensor-unnamed", "src/io/checkpoint_read.cpp",
         "TORCH_CHECK(file.contains(key), ", "TORCH_CHECK(true, ",
         ["momentum_buffer missing from its shard file", "exp_avg missing from its shard file"]),
    ],
    [
        ("buffer-dtype-unchecked", "src/io/checkpoint_format.cpp",
         "TORCH_CHECK(it->second->dtype == mine.dtype, ", "TORCH_CHECK(true, ",
         ["buffer of another dtype (int64 count saved as double)"]),
        ("buffer-header-dtype-unchecked", "src/io/checkpoint_read.cpp",
         "TORCH_CHECK(entry.shape == saved.shape && std::string(c10::toString(entry.dtype)) == saved.dtype,",
         "TORCH_CHECK(entry.shape == saved.shape,",
         ["buffer's header dtype edited (metadata.json's and the CRC-32 unchanged)"]),
        ("one-moment-blamed-on-options", "src/io/checkpoint_load.cpp",
         'TORCH_CHECK(!options_differ || added_by == optimizers::AddedBy::Always, ',
         'TORCH_CHECK(added_by == optimizers::AddedBy::Always, ',
         ["RMSprop: momentum_buffer left out of one parameter's optimizer_moments"]),
    ],
]


def main():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bad_input_mutations as runner
    runner.run_for_table(CHECKPOINT_MUTATIONS, Path(__file__).with_name("bad_checkpoint_table.py"),
                         ["gpt_train", "fsdprun", "checkpoint_tool", "checkpoint_state_tool"])


if __name__ == "__main__":
    main()
