"""Typed question rows and the data errors readers raise (their files: atlas.contracts.questions)."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import asdict, dataclass, field

from atlas.errors import InputError

LETTERS = "ABCD"  # a GPQA question's options, in the order the prompt shows them


class DataError(InputError):
    """Bad input data. The message names the file, the row (or line) and what was expected."""

    def __init__(self, path: str, where: str | None, problem: str, expected: str | None = None):
        self.path, self.where, self.problem, self.expected = path, where, problem, expected
        location = f"{path}, {where}" if where else path
        tail = f"; expected {expected}" if expected else ""
        super().__init__(f"{location}: {problem}{tail}")


def normalise_text(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed: two spellings of one question compare equal."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()


def text_sha256(text: str) -> str:
    return hashlib.sha256(normalise_text(text).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TestCase:
    """One LiveCodeBench test. stdin: `input` is the program's stdin. functional: `input` holds
    one JSON value per line, one per argument of `func_name`; `output` is a JSON value."""

    testtype: str  # "stdin" | "functional"
    input: str
    output: str


@dataclass(frozen=True)
class Question:
    """One question from either benchmark; source-specific fields are None for the other."""

    question_uid: str  # "gpqa:<Record ID>" | "lcb:<question_id>"
    source: str  # "gpqa" | "lcb"
    split: str  # "train" | "val"
    record_id: str  # GPQA Record ID or LCB question_id
    origin: str  # "<file>:<row or line>" where it was read
    question: str  # the question text shown to the policy
    text_sha256: str  # sha256 of the normalised question text (overlap check)
    title: str | None = None
    # GPQA: options in display order; permutation[j] is the original index shown at letter j,
    # where original 0 is the correct answer and 1..3 are Incorrect Answer 1..3.
    options: list[str] | None = None
    permutation: list[int] | None = None
    correct_letter: str | None = None
    subdomain: str | None = None
    domain: str | None = None
    # LiveCodeBench
    platform: str | None = None
    contest_id: str | None = None
    contest_date: str | None = None
    difficulty: str | None = None
    starter_code: str | None = None
    func_name: str | None = None
    test_type: str | None = None
    public_tests: list[TestCase] = field(default_factory=list, repr=False)
    private_tests: list[TestCase] = field(default_factory=list, repr=False)

    def row(self) -> dict:
        """The question's columns (tests go to tests.parquet)."""
        row = asdict(self)
        row["n_public_tests"] = len(row.pop("public_tests"))
        row["n_private_tests"] = len(row.pop("private_tests"))
        return row

    def test_rows(self) -> list[dict]:
        rows = []
        for visibility, tests in (("public", self.public_tests), ("private", self.private_tests)):
            for i, t in enumerate(tests):
                rows.append(
                    {
                        "question_uid": self.question_uid,
                        "split": self.split,
                        "visibility": visibility,
                        "index": i,
                        "testtype": t.testtype,
                        "input": t.input,
                        "output": t.output,
                    }
                )
        return rows
