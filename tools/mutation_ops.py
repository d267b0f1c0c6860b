"""Mutation operators that mutmut 3 lacks, added to its list before it mutates anything.

- a whole condition removed: an `if` or `elif` always taken and never taken (its test replaced by
  True, then by False), a `while` never entered (False);
- a whole loop removed: a `for` statement over nothing (its iterable replaced by an empty tuple).

`tools/mutation.py` runs mutmut through `main` below, so these mutants are made, run and listed
like mutmut's own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import libcst as cst


def operator_condition(node: cst.If | cst.While) -> Iterable[cst.CSTNode]:
    literals = ("True", "False") if isinstance(node, cst.If) else ("False",)
    for literal in literals:
        if not (isinstance(node.test, cst.Name) and node.test.value == literal):
            yield node.with_changes(test=cst.Name(literal))


def operator_zero_iterations(node: cst.For) -> Iterable[cst.For]:
    yield node.with_changes(iter=cst.Tuple(elements=[]))


OPERATORS = [
    (cst.If, operator_condition),
    (cst.While, operator_condition),
    (cst.For, operator_zero_iterations),
]


def install() -> None:
    """Add the operators to mutmut's list (the one object its file mutation reads)."""
    from mutmut.mutation import mutators

    for operator in OPERATORS:
        if operator not in mutators.mutation_operators:
            mutators.mutation_operators.append(operator)


def main() -> None:
    """`python tools/mutation_ops.py ARGS`: mutmut's command line, with the operators above."""
    install()
    from mutmut.__main__ import cli

    sys.argv = ["mutmut", *sys.argv[1:]]
    cli()


if __name__ == "__main__":
    main()
