"""ATLAS Report 25 as a Snakemake pipeline.

    snakemake --cores all results/report25/              # everything, ending in the report folder
    snakemake -n                                  # plan
    snakemake results/report25/ --configfile config/report25.yaml --profile profiles/slurm

The config is checked before any job runs: by the pydantic models of atlas.config (their
messages name the key path), against config/schema.json, which is generated from them, and for
the inputs the user brings (atlas.inputs: every missing question file or model folder, by key).
A --configfile is merged over config/config.yaml, so config/report25.yaml sets every key.
"""

import os
import shlex
import sys
from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")

# Jobs run the atlas package beside this Snakefile: the same files the rules list as inputs.
SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, SRC)
PYTHONPATH = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
shell.prefix(f"export PYTHONPATH={shlex.quote(PYTHONPATH)}; ")
from atlas.config.study import check_yaml_files, parse_config
from atlas.inputs import check_user_inputs
from atlas.runtime.tools import check_runtime_bounds


configfile: "config/config.yaml"


# Pydantic first, for messages that name the key path; then the generated JSON schema. Each
# config file is read again by the project's loader first: Snakemake's keeps the last of two
# equal keys, atlas.config refuses them naming the key and line.
check_yaml_files(workflow.configfiles)
ATLAS = parse_config(config, "(snakemake config)")
JOB_THREADS = ATLAS.resources.threads or workflow.cores  # threads of each model job
validate(config, "config/schema.json", set_default=False)
check_runtime_bounds(ATLAS.runtime)  # token caps above the grammar's hard bound
# The files and the model folder the user brings, every missing one named with its key at once:
# by the main process, where they are local files (not in a job, which re-reads this Snakefile,
# nor under a default storage provider, where inputs live in remote storage).
STORAGE = workflow.storage_settings
LOCAL_INPUTS = STORAGE is None or STORAGE.default_storage_provider is None
if workflow.is_main_process and LOCAL_INPUTS:
    check_user_inputs(ATLAS, "(snakemake config)")


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/model.smk"
include: "rules/runtime.smk"
include: "rules/training.smk"
include: "rules/checks.smk"
include: "rules/validation.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        rules.prepare_data.output,
        MODEL_DIR,
        rules.smoke.output,
        rules.boundary.output,
        expand("results/runs/{run}", run=TRAINING_RUNS),
        rules.dose_step.output,
        expand("results/checks/{run}", run=TRAINING_RUNS),
        expand("results/validation/{policy}", policy=ATLAS.validation.policies),
        rules.report.output,
