"""One module per Snakemake rule, named after the rule: `python -m atlas.stages.<rule>`.

Each holds the rule's `main()` and its argument parsing, and nothing another module imports; the
library they call lives in the other `atlas` packages.
"""
