"""Typed pipeline configuration: one module per section of `config/*.yaml`.

The pydantic models are the single source of truth for the YAML files. The JSON schema that the
Snakefile validates against (`config/schema.json`) is generated from them:

    python -m atlas schema > config/schema.json

Every stage receives only the slice of the config it reads (`atlas.config.study.config_slice`), as
canonical JSON on its command line, so Snakemake reruns a stage exactly when that slice changes.
A stage imports only the sections its slice holds, so that an edit to another section's code (a
field's description, a check) is no code input of it either: `atlas.config.study`, the whole
study, is read by the Snakefile and the command line alone. This package's own module imports
nothing.
"""
