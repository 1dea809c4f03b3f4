#!/usr/bin/env python3
"""Does tests/bad_plan_table.py catch what it claims? The planner's checks (checked sizes, the
--model-json reader and its validation, the JSON nesting bound, config.json's bounds, the
planner's work bound, its flags' ranges), each disabled in turn: tests/bad_input_mutations.py's
runner applies each group of PLAN_MUTATIONS in a separate worktree, rebuilds gpt_train, fsdprun
and fsdp_plan there, runs this table against that build, checks that every case a mutation
targets turns red, then restores the files with git checkout.

    .venv/bin/python tests/bad_plan_mutations.py WORKTREE

WORKTREE must be a configured build of this project (WORKTREE/build) with these files committed.
The mutations of one group touch different checks, and each names only cases that no other check
of the group covers."""
import sys
from pathlib import Path

# (id, file, exact original text, mutated text, [cases that must turn red])
PLAN_MUTATIONS = [
    [
        ("json-depth-unbounded", "src/util/bounded_json.cpp",
         "if (++depth > limit) return i;", "++depth;",
         ["--model-json nested 100,000 deep", "gpt_train --init-from-hf model_type nested 100,000 deep",
          "fsdp_plan --init-from-hf model_type nested 100,000 deep"]),
        ("json-excerpt-uncut", "src/util/bounded_json.cpp",
         "if (text.size() <= max_chars) return text;", "return text;",
         ["--model-json dtype of 10,000 characters", "config.json model_type a 100 KB value"]),
        ("model-json-sizes-unchecked", "src/plan/plan_model_json.cpp",
         "if (value.is_number_integer() && !value.is_number_unsigned() && value.get<int64_t>() >= 0) {",
         "if (value.is_number()) {",
         ["--model-json resident_bytes -1", "--model-json saved -1", "--model-json saved 1e30",
          "--model-json saved 2^64-1", "--model-json sequence_tokens -5"]),
        ("model-json-shape-unchecked", "src/plan/plan_model_json.cpp",
         "  if (!checked_product(param.shape)) refuse(", "  if (false) refuse(",
         ["--model-json shape [2^32, 2^32]"]),
        ("model-json-work-unchecked", "src/plan/plan_model_json.cpp",
         "if (!value->is_number() || !std::isfinite(value->get<double>()) || value->get<double>() < 0) {",
         "if (!value->is_number()) {", ["--model-json forward_flops -1"]),
        ("model-json-names-unchecked", "src/plan/plan_model_json.cpp",
         "  check_unique_names(m);\n", "",
         ["--model-json a parameter named twice", "--model-json a unit named twice"]),
        ("model-json-unit-type-unchecked", "src/plan/plan_model_json.cpp",
         "  if (!json.is_object()) refuse(path, json, \"a JSON object\");", "",
         ["--model-json a unit that is a number"]),
        ("model-json-size-unbounded", "tools/fsdp_plan/main.cpp",
         "constexpr int64_t kMaxModelJsonBytes = int64_t{16} << 20;",
         "constexpr int64_t kMaxModelJsonBytes = int64_t{16} << 40;", ["--model-json of 100 MB"]),
        ("model-json-not-regular-read", "src/util/file_checks.cpp",
         "TORCH_CHECK(S_ISREG(info.st_mode), path,", "TORCH_CHECK(true, path,",
         ["--model-json a FIFO", "--model-json a folder"]),
        ("write-target-unchecked", "tools/fsdp_plan/main.cpp",
         "TORCH_CHECK(::lstat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode),",
         "TORCH_CHECK(true,", ["--write-model-json a FIFO"]),
        ("hf-sizes-unbounded", "examples/gpt/hf_folder.cpp",
         "TORCH_CHECK(value.is_number_unsigned() ? value.get<uint64_t>() <= static_cast<uint64_t>(max)\n"
         "                                         : value.get<int64_t>() <= max,",
         "TORCH_CHECK(true,",
         ["fsdp_plan config.json vocab_size 4611686018427387904",
          "fsdp_plan config.json n_positions 4611686018427387904",
          "fsdp_plan config.json n_layer 1000000000",
          "gpt_train --plan config.json n_layer 1000000000"]),
        ("unit-ranks-unbounded", "src/plan/plan_bounds.cpp",
         "TORCH_CHECK(units <= kMaxUnitRanks / world, \"plan: \",", "TORCH_CHECK(true, \"plan: \",",
         ["--layers 1024 --ranks 1048576"]),
        ("plan-bytes-unbounded", "src/plan/plan_bounds.cpp",
         "TORCH_CHECK(bytes && *bytes <= kMaxPlanBytes,", "TORCH_CHECK(true,",
         ["--model-json sizes past 1 EiB at batch 2",
          "fsdp_plan config.json n_positions 2^40, n_embd 65536 (wpe 2^56 elements)"]),
        ("gpt-sizes-unchecked", "examples/gpt/plan_counting.h",
         "TORCH_CHECK(bytes, \"the GPT's sizes", "TORCH_CHECK(true, \"the GPT's sizes",
         ["fsdp_plan --mingpt, H*T^2 past int64 (n_positions 2^22, n_head 65536)"]),
        ("batches-unbounded", "examples/gpt/gpt_plan.cpp",
         "errno != 0 || value < 1 || value > kMaxBatch", "value < 1",
         ["--batches 99999999999999999999"]),
        ("batches-list-unbounded", "examples/gpt/gpt_plan.cpp",
         "if (out.size() == kMaxSearchBatches) {", "if (false) {", ["--batches with 33 sizes"]),
        ("rates-unbounded", "examples/gpt/command_line.cpp",
         "return real_where([=](double value) { return value >= lo && value <= hi; },",
         "return real_where([=](double value) { return true; },",
         ["--tflops-fp32 1e-300", "--memory-gb 1e300", "--latency-us 1e300"]),
        ("auto-ranks-unchecked", "examples/gpt/gpt_plan.cpp",
         "TORCH_CHECK(flags.ranks == 0 || flags.ranks == dist.world_size(), \"--ranks \",",
         "TORCH_CHECK(true, \"--ranks \",",
         ["--auto --ranks 8 at W=2", "... not blamed on ranks per host"]),
        ("data-walk-errors-ignored", "examples/gpt/gpt_plan.cpp",
         "TORCH_CHECK(!error, \"--data \", folder, \": cannot list \", last,",
         "TORCH_CHECK(true, \"--data \", folder, \": cannot list \", last,",
         ["fsdp_plan --data with a folder that cannot be listed"]),
    ],
]


def main():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bad_input_mutations as runner
    runner.GROUPS = PLAN_MUTATIONS
    runner.TARGETS = ["gpt_train", "fsdprun", "fsdp_plan"]
    if "--table" not in sys.argv:
        sys.argv += ["--table", str(Path(__file__).with_name("bad_plan_table.py"))]
    runner.main()


if __name__ == "__main__":
    main()
