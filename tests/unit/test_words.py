"""The repository speaks of the product: no file describes how the project was developed
(who did what when, goals met or missed, which machine was at hand, how busy it was)."""

import re
import subprocess

from conftest import REPO

# Phrases of a development diary, not of a product. Each is specific enough that the product's own
# words (a `Session` class, `setsid`'s new session, an upstream "verl issue #4620") do not match.
DIARY = {
    "a work session": r"\b(this|that|previous|earlier|last|next|a later|an earlier) session\b",
    "an issue of ours": r"\b(the|this|our|that) issue\b(?! #)|\bissue'?s goal\b",
    "goals met or missed": r"\bgoals? (is |was |were )?(met|missed|reached|not reached)\b|\bthe goal asked\b",
    "a machine lent": r"\blent\b|\bthe lent\b",
    "how busy the machine was": r"\b(slow|fast|busy|quiet) phase\b",
    "a day of work": r"\btoday'?s?\b|\byesterday\b",
    "what was not run": r"\bnot (yet )?(made|run) here\b|\bwas not made\b|\bran out of (device )?time\b",
    "who did the work": r"\bsub-?agents?\b|\bhelper agents?\b",
}
SKIP_SUFFIXES = (".parquet", ".png", ".safetensors", ".json", ".txt", ".csv", ".jsonl")


def tracked_text_files():
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in out.stdout.splitlines():
        if name.endswith(SKIP_SUFFIXES) or name == "tests/unit/test_words.py":
            continue
        path = REPO / name
        try:
            yield name, path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue


def test_no_file_speaks_of_how_the_project_was_developed():
    hits = []
    for name, text in tracked_text_files():
        for lineno, line in enumerate(text.splitlines(), 1):
            for what, pattern in DIARY.items():
                if re.search(pattern, line, re.IGNORECASE):
                    hits.append(f"{name}:{lineno}: {what}: {line.strip()[:100]}")
    assert not hits, "development-diary words in the repository:\n" + "\n".join(hits)


def test_the_patterns_catch_diary_lines_and_spare_product_lines():
    diary = [
        "Measured in the earlier session on the lent GPU.",
        "That issue is done: the goal was met.",
        "17 min 28 s in a busy phase",
        "today's two runs gave 3.6 and 3.7",
        "The full verl + vLLM run was not made here.",
    ]
    product = [
        "class Session:",
        "the program runs in its own session and process group",
        "crashes with AttributeError (verl issue #4620)",
        "a silently dropped bound",
    ]

    def flagged(line):
        return any(re.search(p, line, re.IGNORECASE) for p in DIARY.values())

    assert all(flagged(line) for line in diary)
    assert not any(flagged(line) for line in product)
