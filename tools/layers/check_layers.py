#!/usr/bin/env python3
"""The layer check: every file in src/ lives in one layer's folder and includes only from its own
layer and the layers below it (docs/architecture.md). A public header <fsdp/X.h> belongs to the
layer that implements it (PUBLIC below). Exits 1 naming each upward include.

    python3 tools/layers/check_layers.py [REPO]
"""
import os
import re
import sys

# Lowest first: a layer may include from itself and the layers before it.
LAYERS = ["util", "launch", "comm", "device", "tp", "core", "optim", "io", "pp", "plan"]

# Public headers (include/fsdp/) by the layer whose sources implement them.
PUBLIC = {
    "file_checks.h": "util", "named_tensors.h": "util", "memory.h": "util", "run_lock.h": "util", "trace.h": "util",
    "printable.h": "util",
    "error_text.h": "util",
    "checked_math.h": "util", "bounded_json.h": "util",
    "distributed.h": "launch", "peer_errors.h": "launch", "launch_env.h": "launch",
    "replica_quorum.h": "launch",
    "comm_stats.h": "comm",
    "device_mesh.h": "tp", "tensor_parallel.h": "tp", "parallelize.h": "tp", "tp_placement.h": "tp",
    "options.h": "core", "fully_shard.h": "core", "auto_wrap.h": "core", "unit_runtime.h": "core",
    "output_tensors.h": "core", "sharded_model.h": "core",
    "clip.h": "optim", "grad_scaler.h": "optim", "fused_adamw.h": "optim",
    "fused_sgd.h": "optim", "steps_in_backward.h": "optim", "muon.h": "optim",
    "checkpoint.h": "io", "async_checkpoint.h": "io", "safetensors.h": "io", "tensor_file.h": "io",
    "state_dict.h": "io", "param_loader.h": "io", "summon_full_params.h": "io",
    "pipeline.h": "pp", "pipeline_checkpoint.h": "pp",
    "plan.h": "plan", "plan_pipeline.h": "plan",
    "fsdp.h": "plan",  # the umbrella header: everything
}

# The public face: what users include. A header in src/ includes none of them: the plumbing their
# templates need is in <fsdp/unit_runtime.h> ([Note: the public face carries no plumbing]).
FACE = {"fully_shard.h", "auto_wrap.h", "fsdp.h", "summon_full_params.h", "state_dict.h"}

# Inside src/core, lowest first: a file (X.h, X.cpp) includes "core/Y.h" and core's public
# headers <fsdp/Y.h> only from its own tier or one below. A unit (param_group) calls nothing
# above it: the model (fsdp_state) calls it; and neither includes the face's plumbing
# (unit_runtime, unit_slot) or the handle (sharded_model), which sit above them.
CORE_TIERS = [
    {"flat_layout", "unit_rules", "step_conductor", "limiter_count", "unit_order", "buffer_storage", "flat_param",
     "rate_limiter", "model_check", "options", "output_tensors", "gradients_reduced_hook", "gradient_watch",
     "stage_marks"},
    {"unit_comm"},
    {"unit_collectives", "unit_env"},
    {"param_group"},
    {"fsdp_state"},
    {"model_collectives", "unit_groups", "sharded_view", "sharded_model", "unit_slot",
     "unit_runtime", "unshard_hold"},
    {"shard_pipeline"},
    {"deferred_init", "fully_shard", "activation_checkpoint", "auto_wrap"},
]

# The only core headers the layers above core (optim, io, plan) include: the engine's units, flat
# parameters and their entries are core's own; the layers above see the sharded model through
# core/sharded_view.h, and the planner reads the engine's tensor-free rules ([Note: one rulebook,
# two readers]), runs its step conductor ([Note: one schedule, two kinds of units]) and each
# unit's order with the limiter's counts ([Note: one order inside a unit]); a pipeline stage holds its
# model unsharded across micro-batches through core/unshard_hold.h ([Note: units held unsharded]),
# and marks its parameters as a stage's through core/stage_marks.h, which clipping reads.
CORE_FOR_ABOVE = {"sharded_view.h", "flat_layout.h", "unit_rules.h", "step_conductor.h", "limiter_count.h",
                  "unit_order.h", "unshard_hold.h", "stage_marks.h"}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
SOURCE = (".h", ".cpp", ".in")


def includes(path):
    """The (kind, target) of each #include of a file: kind '<' or '"'."""
    with open(path, encoding="utf-8") as f:
        return INCLUDE.findall(f.read())


def rank(layer):
    return LAYERS.index(layer)


def included_layer(kind, target, own_layer):
    """The layer of an include, or None for a header from outside the project."""
    if kind == "<":
        if not target.startswith("fsdp/"):
            return None
        name = target[len("fsdp/"):]
        if name not in PUBLIC:
            raise LookupError(f"<{target}> is not in tools/layers/check_layers.py's PUBLIC table")
        return PUBLIC[name]
    head = target.split("/")[0]
    return head if "/" in target and head in LAYERS else own_layer


def check_file(path, own_layer, shown):
    errors = []
    for kind, target in includes(path):
        try:
            layer = included_layer(kind, target, own_layer)
        except LookupError as e:
            errors.append(f"{shown}: {e}")
            continue
        if layer is not None and rank(layer) > rank(own_layer):
            errors.append(f"{shown}: includes {kind}{target}{'>' if kind == '<' else kind} of layer "
                          f"'{layer}', above its own layer '{own_layer}' (order, lowest first: "
                          f"{' < '.join(LAYERS)})")
    return errors


def core_tier(stem):
    for i, tier in enumerate(CORE_TIERS):
        if stem in tier:
            return i
    raise LookupError(f"src/core/{stem}: not in tools/layers/check_layers.py's CORE_TIERS")


def check_inside_core(path, name):
    """A core file includes core headers of its own tier or below, and no public face."""
    errors = []
    shown = f"src/core/{name}"
    try:
        own = core_tier(name.split(".")[0])
    except LookupError as e:
        return [str(e)]
    for kind, target in includes(path):
        public = kind == "<" and target.startswith("fsdp/") and PUBLIC.get(target[len("fsdp/"):]) == "core"
        if (kind == '"' and target.startswith("core/")) or public:
            stem = target.split("/", 1)[1].split(".")[0]
            try:
                tier = core_tier(stem)
            except LookupError as e:
                errors.append(f"{shown}: {e}")
                continue
            if tier > own:
                shown_target = f"<{target}>" if public else f'"{target}"'
                errors.append(f"{shown}: includes {shown_target}, above it inside core (tiers, lowest "
                              f"first: {' < '.join('/'.join(sorted(t)) for t in CORE_TIERS)})")
    return errors


def check_core_view(path, shown):
    """A file above core includes no core header but those of CORE_FOR_ABOVE."""
    return [f"{shown}: includes \"{target}\", core's own; above core include only "
            f"{', '.join(f'core/{h}' for h in sorted(CORE_FOR_ABOVE))}"
            for kind, target in includes(path)
            if kind == '"' and target.startswith("core/") and target[len("core/"):] not in CORE_FOR_ABOVE]


def check_no_face(path, shown):
    """A header in src/ includes none of the public face's headers."""
    return [f"{shown}: includes <{target}>, the public face; include <fsdp/unit_runtime.h> for "
            f"the plumbing ([Note: the public face carries no plumbing])"
            for kind, target in includes(path)
            if kind == "<" and target.startswith("fsdp/") and target[len("fsdp/"):] in FACE]


def check(repo):
    errors = []
    src = os.path.join(repo, "src")
    for entry in sorted(os.listdir(src)):
        path = os.path.join(src, entry)
        if os.path.isfile(path):
            if entry.endswith(SOURCE):
                errors.append(f"src/{entry}: outside every layer folder ({', '.join(LAYERS)})")
            continue
        if entry not in LAYERS:
            errors.append(f"src/{entry}/: not a layer (add it to LAYERS and docs/architecture.md)")
            continue
        for name in sorted(os.listdir(path)):
            if name.endswith(SOURCE):
                errors += check_file(os.path.join(path, name), entry, f"src/{entry}/{name}")
                if name.endswith(".h"):
                    errors += check_no_face(os.path.join(path, name), f"src/{entry}/{name}")
                if entry == "core":
                    errors += check_inside_core(os.path.join(path, name), name)
                elif rank(entry) > rank("core"):
                    errors += check_core_view(os.path.join(path, name), f"src/{entry}/{name}")
    public = os.path.join(repo, "include", "fsdp")
    for name in sorted(os.listdir(public)):
        if name not in PUBLIC:
            errors.append(f"include/fsdp/{name}: not in tools/layers/check_layers.py's PUBLIC table")
            continue
        errors += check_file(os.path.join(public, name), PUBLIC[name], f"include/fsdp/{name}")
    return errors


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))))
    errors = check(repo)
    for error in errors:
        print(error)
    print(f"layer check: {len(errors)} upward or unplaced include(s)" if errors else
          "layer check: every include goes to the same layer or one below")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
