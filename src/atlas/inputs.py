"""The files and folders a config names that the user brings: question files, the model folder.

The embedded default points at the shipped fixtures and builds its own model; config/report25.yaml
points at the user's GPQA and LiveCodeBench files and a local model folder. The Snakefile checks
them all before any job runs, so a missing one is named with its config key and what it must be,
all at once, instead of one Snakemake MissingInputException at a time:

    missing inputs (snakemake config): 5 paths the config names are not there
      data.gpqa.train: data/gpqa/gpqa_train.csv does not exist; expected the GPQA training ...
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from atlas.config.data import SourceFiles
from atlas.config.study import AtlasConfig
from atlas.data.gpqa import REQUIRED_COLUMNS
from atlas.data.lcb import REQUIRED_KEYS
from atlas.errors import InputError

GPQA_FILE = f"a CSV with the upstream columns ({', '.join(REQUIRED_COLUMNS)})"
LCB_FILE = f"a code_generation_lite JSONL file, one problem a line with the upstream keys ({', '.join(REQUIRED_KEYS)})"
MODEL_FOLDER = (
    "a local Hugging Face model folder: config.json, *.safetensors weights and the tokenizer's files"
)


class MissingInputsError(InputError):
    """Inputs the config names are not there; the message names each path, key and expectation."""


@dataclass(frozen=True)
class UserInput:
    """One path the config names: its key path, the path, file or folder, and what it must hold."""

    key: str
    path: str
    kind: str  # "file" | "model"
    expected: str


def _question_files(name: str, files: SourceFiles, what: str, unit: str, layout: str) -> list[UserInput]:
    out = []
    for split, word in (("train", "training"), ("val", "validation")):
        n = getattr(files, f"{split}_questions")
        expected = f"the {what} {word} {unit}: {layout}" + ("" if n is None else f", {n} of them")
        out.append(UserInput(f"data.{name}.{split}", getattr(files, split), "file", expected))
    return out


def user_inputs(config: AtlasConfig) -> list[UserInput]:
    """Every path of `config` that no rule makes, in config order."""
    out = _question_files("gpqa", config.data.gpqa, "GPQA", "questions", GPQA_FILE)
    out += _question_files("lcb", config.data.lcb, "LiveCodeBench", "problems", LCB_FILE)
    if config.model.path is not None:
        out.append(UserInput("model.path", config.model.path, "model", MODEL_FOLDER))
    if config.model.tiny is not None:
        for i, path in enumerate(config.model.tiny.corpus):
            out.append(
                UserInput(
                    f"model.tiny.corpus[{i}]", path, "file", "a UTF-8 text file the tokenizer trains on"
                )
            )
    return out


def _problem(item: UserInput, root: Path) -> str | None:
    """Why `item` cannot be read as it must be, or None when it can."""
    path = root / item.path
    if not path.exists():
        return "does not exist"
    if item.kind == "file":
        return None if path.is_file() else "is not a file"
    if not path.is_dir():
        return "is not a folder"
    lacks = [
        what
        for what, present in (
            ("config.json", (path / "config.json").is_file()),
            ("*.safetensors weights", any(path.glob("*.safetensors"))),
        )
        if not present
    ]
    return f"has no {' and no '.join(lacks)}" if lacks else None


def missing_inputs(config: AtlasConfig, root: Path | str = ".") -> list[str]:
    """One line per user input that is not there (relative paths are read from `root`, the
    workflow's working directory): key, path, what is wrong, what it must be."""
    lines = []
    for item in user_inputs(config):
        problem = _problem(item, Path(root))
        if problem is not None:
            lines.append(f"{item.key}: {item.path} {problem}; expected {item.expected}")
    return lines


def check_user_inputs(config: AtlasConfig, source: str, root: Path | str = ".") -> None:
    """Raise MissingInputsError naming every user input that is not there."""
    lines = missing_inputs(config, root)
    if lines:
        paths = "path the config names is" if len(lines) == 1 else "paths the config names are"
        raise MissingInputsError(
            "\n  ".join([f"missing inputs {source}: {len(lines)} {paths} not there", *lines])
            + "\nput each one there, or point its key at your copy in a --configfile"
        )
