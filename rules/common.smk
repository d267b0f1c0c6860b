# Helpers shared by the rule files. The source files a stage runs, and the config slice it reads.

from atlas.config.study import config_slice
from atlas.hashing import canonical_json
from atlas.sources import module_files


def code(stage_module):
    """Source files of `stage_module` and every atlas module it imports: an edit to any of
    them reruns the rule, a touch does not (Snakemake compares their checksums)."""
    return module_files(stage_module, src=SRC, relative_to=workflow.basedir)


def stage_slice(stage):
    """The plain JSON of the config keys `stage` reads; params compare it between runs."""
    return canonical_json(config_slice(ATLAS, stage))


# Where later stages find the base model: the built tiny model, or the user's local folder.
MODEL_DIR = (
    f"results/models/{ATLAS.model.name}"
    if ATLAS.model.tiny is not None
    else ATLAS.model.path
)


# The module a training job runs: the local trainer, or the verl launcher (same inputs, same
# output folder, so both engines plan the same DAG).
TRAIN_MODULE = {"local": "atlas.stages.train", "verl": "atlas.stages.train_verl"}[
    ATLAS.training.engine
]


# How a training job starts: one process, or N data-parallel ranks under torchrun (the local
# trainer only; resources.gpus, or resources.ranks on a CPU). --standalone picks a free port.
TRAIN_RANKS = ATLAS.resources.world_size if ATLAS.training.engine == "local" else 1
TRAIN_LAUNCH = (
    "python"
    if TRAIN_RANKS == 1
    else f"torchrun --standalone --nproc-per-node {TRAIN_RANKS}"
)


# The training runs of the config (the training smoke and the arms), one job each.
TRAINING_RUNS = sorted(ATLAS.runs)


def snapshot_folder(snapshot_of):
    """The run folder a frozen-critic potential reads, as an input (none without a snapshot)."""
    return [] if snapshot_of is None else [f"results/runs/{snapshot_of}"]


def snapshot_arg(snapshot_of):
    """The --snapshot argument of the training and dose-step commands."""
    return "" if snapshot_of is None else f"--snapshot results/runs/{snapshot_of}"
