"""gpt_train --pp's rows of bad_input_table.py: each flag that does not compose with a pipeline
yet is refused before any work, naming the flag and why; the pipeline's own flags against each
other and the model; at dp 2 (4 ranks), what FSDP inside a stage does not compose with yet."""


def flag_cases(tmp):
    """(name, extra flags of the tiny run, needles) for one rank each, as the table's flag cases."""
    return [
        *[(f"--pp 2 with {' '.join(flags)}", ["--pp", "2", *flags], (f"--pp does not run with {named}",))
          for flags, named in (
              (["--reference"], "--reference"),
              (["--eval-tokens", str(tmp / "pp-eval.bin"), "--eval-out", str(tmp / "pp-eval.pt")], "--eval-out"),
              (["--auto", "--max-memory-gb", "1", "--tp-sizes", "1,2"], "--auto --tp-sizes"),
              (["--cpu-offload"], "--cpu-offload"),
              (["--plan", "--grad-accum", "2"], "--plan/--auto with --grad-accum"),
              (["--param-dtype", "fp16"], "fp16"),
              (["--no-sync", "--grad-accum", "2"], "--no-sync"),
              (["--deferred-init"], "--deferred-init"),
              (["--no-reshard-after-forward"], "--no-reshard-after-forward"),
              (["--step-in-backward"], "--step-in-backward"))],
        ("--pp 2 --plan with 1 block", ["--pp", "2", "--plan"], ("--layers >= 2", "got --layers 1")),
        ("--microbatches without --pp", ["--microbatches", "2"], ("--microbatches only applies with --pp",)),
        ("--pp 2 --stages-per-rank 2 under 1f1b", ["--pp", "2", "--layers", "4", "--stages-per-rank", "2"],
         ("--stages-per-rank 2 needs --pp-schedule interleaved-1f1b or zbv",)),
        ("--pp-schedule zbv --stages-per-rank 3", ["--pp", "2", "--pp-schedule", "zbv", "--stages-per-rank", "3"],
         ("--pp-schedule zbv places 2 stages per rank",)),
        ("--pp 2 with 1 block", ["--pp", "2", "--microbatches", "2"], ("--layers >= 2", "got --layers 1")),
        ("--pp 2 1f1b --microbatches 1", ["--pp", "2", "--layers", "2"], ("--microbatches 1",)),
        ("--pp 2 on one rank", ["--pp", "2", "--layers", "2", "--microbatches", "2"],
         ("--pp 2 does not divide the 1 ranks",)),
        ("--pp 2 --tp 2 on one rank", ["--pp", "2", "--tp", "2", "--layers", "2", "--microbatches", "2"],
         ("--pp 2 x --tp 2 does not divide the 1 ranks",)),
    ]


def under_sharding(t, sharded):
    """gpt_train --pp with its stages sharded (dp 2, or mixed precision at dp 1): what FSDP inside
    a stage does not compose with is refused by the flags at fault: a head tied to wte (GPT-2,
    the Llama's --tie-head) under ZBV, whose first and last stage share rank 0, and ZBV with
    --activation-checkpointing."""
    tied = sharded("--pp", "2", "--layers", "4", "--microbatches", "2", "--pp-schedule", "zbv", n=4, timeout=60)
    t.fails("--pp 2 --pp-schedule zbv at dp 2, GPT-2's tied head", tied, "--pp-schedule zbv at dp 2",
            "--model gpt2", "tied to wte", "dp 1")
    # At dp 1 too, what needs a sharded stage (mixed precision) names the flag that needs it.
    tied_bf16 = sharded("--pp", "2", "--layers", "4", "--microbatches", "2", "--pp-schedule", "zbv",
                        "--param-dtype", "bf16", n=2, timeout=60)
    t.fails("--pp 2 --pp-schedule zbv at dp 1 --param-dtype bf16, GPT-2's tied head", tied_bf16,
            "--pp-schedule zbv at dp 1", "with --param-dtype/--reduce-dtype", "tied to wte")
    zbv_recompute = sharded("--pp", "2", "--layers", "4", "--microbatches", "2", "--pp-schedule", "zbv",
                            "--model", "llama", "--activation-checkpointing", n=2, timeout=60)
    t.fails("--pp 2 --pp-schedule zbv --activation-checkpointing", zbv_recompute,
            "--pp-schedule zbv does not run with --activation-checkpointing", "1f1b")
    llama_tied = sharded("--pp", "2", "--layers", "4", "--microbatches", "2", "--pp-schedule", "zbv",
                         "--model", "llama", "--tie-head", n=4, timeout=60)
    t.fails("--pp 2 --pp-schedule zbv at dp 2, --model llama --tie-head", llama_tied, "--tie-head", "tied to wte")
    hybrid = sharded("--pp", "2", "--layers", "2", "--microbatches", "2", "--model", "llama",
                     "--strategy", "hybrid", "--shard-group-size", "2", n=4, timeout=60)
    t.fails("--pp 2 --strategy hybrid at dp 2", hybrid, "--strategy hybrid under --pp 2", "dp = 2 ranks",
            "at least 2 groups")
    tp_clip = sharded("--pp", "2", "--tp", "2", "--layers", "2", "--microbatches", "2", "--clip", "1",
                      n=4, timeout=60)
    t.fails("--pp 2 --tp 2 --clip 1", tp_clip, "--pp with --tp 2 does not run with --clip")
