# Helpers shared by the rule files. The source files a stage runs, and the config slice it reads.

from atlas.config import config_slice
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
