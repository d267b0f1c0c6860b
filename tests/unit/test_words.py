"""The repository speaks of the product: no file describes how the project was developed
(who did what when, goals met or missed, which machine was at hand, how busy it was)."""

import io
import re
import subprocess
import tokenize

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

# Where a development history would show in prose: a run's or an attempt's number, a commit named
# by its hash, the scratch output folder of a machine (`$OUT`). Checked in the prose of the
# repository: Markdown and reStructuredText, every line of tests/, and comments and docstrings
# elsewhere; program output kept as evidence (logs) and data files are not prose.
HISTORY = {
    "a run's number": re.compile(
        r"\b(fresh[- ]clone |cold |warm )?run #?\d+\b(?! (steps?|jobs?|ranks?|times|questions|turns)\b)",
        re.IGNORECASE,
    ),
    "an attempt's name": re.compile(r"\battempt[-_ ]?#?\d+\b", re.IGNORECASE),
    "the scratch output folder": re.compile(r"\$\{?OUT\b"),
}
# A commit id: 7 to 40 lowercase hex digits with at least one digit and one letter, standing alone
# (a sha256 of a file is 64 digits, so it never matches whole; a word like "defaced" has no digit).
COMMIT_ID = re.compile(
    r"(?<![0-9a-zA-Z_./:-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![0-9a-zA-Z_])"
)
# Commits of other projects that atlas follows, named where the prose says which upstream code it matches.
UPSTREAM_COMMITS = {
    "28fef95": "the LiveCodeBench checkout scripts/bench_graders.py compares the LCB grader with"
}
PROSE_SUFFIXES = (".md", ".rst")
CODE_SUFFIXES = (".py", ".smk")


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


def _comments_and_docstrings(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each comment and triple-quoted string of Python-like source (a
    Snakefile or rule file tokenizes as Python)."""
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string))
            elif tok.type == tokenize.STRING and re.match(r"[rRbBuUfF]*(\"\"\"|\'\'\')", tok.string):
                out += [(tok.start[0] + i, line) for i, line in enumerate(tok.string.splitlines())]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def prose_lines(name: str, text: str, *, whole_tests: bool) -> list[tuple[int, str]]:
    """The lines of a tracked file that are prose: every line of a Markdown or reStructuredText
    page (and of a test, with `whole_tests`), the comments and docstrings of code, the `#`
    comments of shell, YAML and TOML files."""
    lines = list(enumerate(text.splitlines(), 1))
    if name.endswith(PROSE_SUFFIXES) or (whole_tests and name.startswith("tests/")):
        return lines
    if name.endswith(CODE_SUFFIXES) or name.rsplit("/", 1)[-1] == "Snakefile":
        return _comments_and_docstrings(text)
    if name.endswith((".sh", ".yaml", ".yml", ".toml")) or name in (".ci/run", ".gitignore"):
        return [(n, m.group(1)) for n, line in lines if (m := re.search(r"(?:^|\s)(#.*)$", line))]
    return []


def test_no_prose_names_a_run_an_attempt_a_commit_or_a_scratch_folder():
    hits = []
    for name, text in tracked_text_files():
        if name.endswith(".log"):
            continue
        for lineno, line in prose_lines(name, text, whole_tests=True):
            hits += [
                f"{name}:{lineno}: {what}: {line.strip()[:100]}"
                for what, p in HISTORY.items()
                if p.search(line)
            ]
        for lineno, line in prose_lines(name, text, whole_tests=False):
            if any(m.group() not in UPSTREAM_COMMITS for m in COMMIT_ID.finditer(line)):
                hits.append(f"{name}:{lineno}: a commit id: {line.strip()[:100]}")
    assert not hits, "development history in the repository's prose:\n" + "\n".join(hits)


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


def test_the_history_patterns_catch_numbers_and_hashes_and_spare_product_lines():
    history = [
        "the fresh-clone run 3 gave 283 s",
        "Run 2 was cut at step 4.",
        "attempt-1 failed; attempt 2 passed",
        "see attempt_3's log",
        "the figures in $OUT/update_8b.json",
        "python scripts/bench_update.py --out ${OUT}/x.json",
    ]
    product = [
        "each arm can run 2 steps of the schedule",
        "the job's out=$out folder",
        "retries up to 3 attempts",
        "OUT_DIR holds the report",
    ]
    flagged = lambda line: any(p.search(line) for p in HISTORY.values())  # noqa: E731
    assert [line for line in history if not flagged(line)] == []
    assert [line for line in product if flagged(line)] == []

    commits = [
        "fixed in 4303a75",
        "since f856782d (the split kernel)",
        "reverts 5a527c5ab3f0e6d1c2b4a9e8f7d6c5b4a3f2e1d0",
    ]
    not_commits = [
        "sha256 " + "9f2c" * 16,  # a file's digest: 64 digits
        "the colour #1f77b4",
        "a word like defaced or facade",
        "results/checkpoints/7a3b9c1d/",  # a path
        "0x7fffffff",
        "2026-05-09",
        "1234567 rows",
    ]
    assert [line for line in commits if not COMMIT_ID.search(line)] == []
    assert [line for line in not_commits if COMMIT_ID.search(line)] == []


def test_prose_is_read_from_pages_tests_comments_and_docstrings():
    code = 'x = "abc1234def"  # fixed in 4303775\ndef f():\n    """Since f856782."""\n    return "deadbee1"\n'
    assert prose_lines("src/m.py", code, whole_tests=False) == [
        (1, "# fixed in 4303775"),
        (3, '"""Since f856782."""'),
    ]
    assert len(prose_lines("tests/unit/test_m.py", code, whole_tests=True)) == 4
    assert prose_lines("tests/unit/test_m.py", code, whole_tests=False) == prose_lines(
        "src/m.py", code, whole_tests=False
    )
    assert prose_lines("scripts/x.sh", 'out=${OUT:-x}  # default\necho "#1"\n', whole_tests=True) == [
        (1, "# default")
    ]
    assert prose_lines("docs/x.md", "a\nb", whole_tests=False) == [(1, "a"), (2, "b")]
