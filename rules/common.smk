# Helpers every rule file uses: the source files a stage runs, and the config slice it reads.

from atlas.config import config_slice
from atlas.hashing import canonical_json
from atlas.sources import module_files


def code(module):
    """Source files of `module` and every atlas module it imports: an edit to any of them
    reruns the rule, a touch does not (Snakemake compares their checksums)."""
    return module_files(module, relative_to=workflow.basedir)


def stage_slice(stage):
    """The plain JSON of the config keys `stage` reads; params compare it between runs."""
    return canonical_json(config_slice(ATLAS, stage))


# Where later stages find the base model: the built tiny model, or the user's local folder.
MODEL_DIR = (
    f"results/models/{ATLAS.model.name}" if ATLAS.model.tiny is not None else ATLAS.model.path
)
