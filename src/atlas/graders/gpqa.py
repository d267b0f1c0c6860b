"""GPQA grader: the submitted letter against the question's correct letter (after its shuffle)."""

from __future__ import annotations

from atlas.data.schema import LETTERS


def grade_letter(answer: str, correct_letter: str) -> float:
    """1.0 when `answer` (trimmed, any case) is `correct_letter`, else 0.0; letters outside A-D
    score 0.0."""
    if correct_letter not in LETTERS or len(correct_letter) != 1:
        raise ValueError(f"correct letter {correct_letter!r}: expected one of {', '.join(LETTERS)}")
    return 1.0 if answer.strip().upper() == correct_letter else 0.0
