"""One module per Snakemake rule, named after the rule: `python -m atlas.stages.<rule>`.

Each holds the rule's `main()` and its argument parsing, and nothing another module imports; the
library they call lives in the other `atlas` packages.

Run as a program, a stage dies with the process that started it (atlas.lifetime), from before it
imports anything heavy: this package runs first, while Python locates the stage module, and
`sys.argv[0]` is then "-m" (the documented value of `python -m` during that search).
"""

import sys

if sys.argv[:1] == ["-m"]:
    from atlas.lifetime import die_with_parent

    die_with_parent()
