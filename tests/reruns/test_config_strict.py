"""Config values are finite and strictly typed, and no YAML key is given twice: the same message
from Snakemake, `python -m atlas config` and the grader CLI."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, copy_workflow

DEFAULT = (REPO / "config" / "config.yaml").read_text(encoding="utf-8")


def edited(old: str, new: str) -> str:
    assert DEFAULT.count(old) == 1, old
    return DEFAULT.replace(old, new)


def three_messages(workdir: Path, text: str) -> dict[str, tuple[int, str]]:
    """(exit status, output) of each of the three readers on a config file holding `text`."""
    bad = workdir / "bad.yaml"
    bad.write_text(text, encoding="utf-8")
    run = lambda *cmd: subprocess.run(  # noqa: E731
        [sys.executable, *cmd], cwd=workdir, capture_output=True, text=True, timeout=300
    )
    out = {}
    for name, cmd in {
        "config": ("-m", "atlas", "config", str(bad)),
        "grade": (
            "-m",
            "atlas",
            "grade",
            "lcb",
            "--problem",
            "p.json",
            "--code",
            "c.py",
            "--config",
            str(bad),
        ),
        "snakemake": ("-m", "snakemake", "-n", "--cores", "1", "--configfile", str(bad)),
    }.items():
        proc = run(*cmd)
        out[name] = (proc.returncode, proc.stdout + proc.stderr)
    return out


CASES = [
    pytest.param(
        ("  program_timeout_s: 10.0", "  program_timeout_s: .inf"),
        "graders.program_timeout_s: Input should be a finite number (got inf)",
        id="infinite",
    ),
    pytest.param(
        ("  steps: 4\n", '  steps: "4"\n'),
        "schedule.steps: Input should be a valid integer (got '4': a string; write the number unquoted",
        id="string-for-int",
    ),
    pytest.param(
        ("  questions_per_step: 2", "  questions_per_step: true"),
        "schedule.questions_per_step: Input should be a valid integer (got True: a boolean, not a number)",
        id="bool-for-int",
    ),
]


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("wf"))


@pytest.mark.parametrize("edit, expected", CASES)
def test_bad_number_is_refused_with_one_message_everywhere(workflow, edit, expected):
    results = three_messages(workflow, edited(*edit))
    for name, (code, out) in results.items():
        assert code != 0, name
        assert expected in out, f"{name}:\n{out}"
    assert "Building DAG" not in results["snakemake"][1]
    assert not (workflow / "results").exists()


def test_duplicated_key_is_refused_naming_key_and_line(workflow):
    lines = DEFAULT.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("  steps:"))
    text = "".join([*lines[: first + 1], "  steps: 99\n", *lines[first + 1 :]])
    results = three_messages(workflow, text)
    expected = f"bad.yaml, line {first + 2}: duplicate key 'steps' (first at line {first + 1})"
    for name, (code, out) in results.items():
        assert code != 0, name
        assert expected in out, f"{name}:\n{out}"
    assert "Building DAG" not in results["snakemake"][1]
