"""ATLAS Report 25 as a Snakemake pipeline.

    snakemake --cores all results/data/val.parquet results/models/tiny
    snakemake -n                                  # plan
    snakemake --configfile config/report25.yaml --profile profiles/slurm ...

The config is checked twice before any job runs: against config/schema.json (generated from
atlas.config), then by the pydantic models themselves for the cross-field rules.
"""

import sys
from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from atlas.config import parse_config


configfile: "config/config.yaml"


validate(config, "config/schema.json")
ATLAS = parse_config(config, "(snakemake config)")


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/model.smk"


rule all:
    default_target: True
    input:
        rules.prepare_data.output,
        MODEL_DIR,
