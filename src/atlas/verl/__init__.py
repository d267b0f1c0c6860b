"""The verl V1 integration (`training.engine: verl`): agent loop, reward placement, critic LoRA,
config generation and launcher, and the converter from verl's outputs to this project's files.

verl is an optional extra with its own environment (see the README); nothing else in `atlas`
imports this package.
"""

from atlas.verl.versions import check_xgrammar

check_xgrammar()
