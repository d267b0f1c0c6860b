"""atlas: ATLAS Report 25 ("Sequential Tool Runtime Upgrade") as a content-hashed Snakemake pipeline.

Importing the package is cheap (standard library only); stages import what they need.
"""

__version__ = "0.1.0"
