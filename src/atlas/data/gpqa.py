"""GPQA CSV reader (the upstream gpqa_{extended,main,diamond}.csv column layout).

The correct answer always sits in its own column upstream, so options are shuffled. Each question's
permutation is a pure function of its Record ID (sha256 keys, no RNG state), so every process, worker
and rerun shows the same letters, and the permutation and correct letter are stored with the row.
"""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

from atlas.data.schema import LETTERS, DataError, Question, text_sha256

REQUIRED_COLUMNS = (
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
    "Record ID",
)
OPTIONAL_COLUMNS = ("Subdomain", "High-level domain")
_PERMUTATION_SALT = "atlas/gpqa-options/v1"


def option_permutation(record_id: str) -> list[int]:
    """permutation[j] = original index shown at letter j (0 = correct, 1..3 = Incorrect 1..3)."""

    def key(i: int) -> str:
        return hashlib.sha256(f"{_PERMUTATION_SALT}:{record_id}:{i}".encode()).hexdigest()

    return sorted(range(4), key=key)


def normalise_newlines(text: str) -> str:
    """CRLF and lone CR inside a field become LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def same_answer(a: str, b: str) -> bool:
    """Two answers that read the same once runs of whitespace are one space (and case kept)."""
    return " ".join(a.split()) == " ".join(b.split())


def read_gpqa(path: str | Path, split: str) -> list[Question]:
    path = str(path)
    if Path(path).stat().st_size == 0:
        raise DataError(path, None, "file is empty", "a GPQA CSV with a header row and data rows")
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, strict=True)
        try:
            header = next(reader)
            rows = list(reader)
        except csv.Error as err:
            raise DataError(
                path,
                f"line {reader.line_num}",
                f"malformed CSV ({err}); the file may be truncated",
                "RFC 4180 CSV with every quoted field closed",
            ) from None

    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise DataError(
            path, "header", f"missing columns {missing}", f"the GPQA columns {list(REQUIRED_COLUMNS)}"
        )
    if not rows:
        raise DataError(path, None, "no data rows after the header", "one row per question")

    col = {name: header.index(name) for name in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if name in header}
    questions: list[Question] = []
    first_row_of: dict[str, int] = {}
    for n, row in enumerate(rows, start=1):
        where = f"row {n}"
        if len(row) != len(header):
            raise DataError(
                path,
                where,
                f"{len(row)} fields, the header has {len(header)}; the file may be truncated",
                f"{len(header)} fields per row",
            )
        # Line endings inside a field are one "\n" whatever the file's own line endings are.
        value = {name: normalise_newlines(row[i]).strip() for name, i in col.items()}
        for name in REQUIRED_COLUMNS:
            if not value[name]:
                raise DataError(path, where, f"empty {name!r}", "a non-empty value")
        record_id = value["Record ID"]
        if record_id in first_row_of:
            raise DataError(
                path,
                where,
                f"duplicate Record ID {record_id!r} (first seen in row {first_row_of[record_id]})",
                "unique Record IDs",
            )
        first_row_of[record_id] = n

        original = [value["Correct Answer"]] + [value[f"Incorrect Answer {k}"] for k in (1, 2, 3)]
        for k in (1, 2, 3):
            if same_answer(original[0], original[k]):
                raise DataError(
                    path,
                    where,
                    f"'Correct Answer' equals 'Incorrect Answer {k}' ({original[0]!r}) after "
                    "normalising whitespace, so the question has no single right option",
                    "a correct answer that differs from every incorrect one",
                )
        permutation = option_permutation(record_id)
        questions.append(
            Question(
                question_uid=f"gpqa:{record_id}",
                source="gpqa",
                split=split,
                record_id=record_id,
                origin=f"{path}:{where}",
                question=value["Question"],
                text_sha256=text_sha256(value["Question"]),
                options=[original[i] for i in permutation],
                permutation=permutation,
                correct_letter=LETTERS[permutation.index(0)],
                subdomain=value.get("Subdomain") or None,
                domain=value.get("High-level domain") or None,
            )
        )
    return questions
