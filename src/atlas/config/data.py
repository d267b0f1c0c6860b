"""The question inputs and the ordered schedule (`data`, `schedule`), and the data stage's slice."""

from __future__ import annotations

from pydantic import Field

from atlas.config.base import Strict


class SourceFiles(Strict):
    """Where one benchmark's question files live, and how many questions each must hold."""

    train: str = Field(description="Path of the training question file (read in file order).")
    val: str = Field(description="Path of the validation question file (read in file order).")
    train_questions: int | None = Field(
        default=None,
        ge=1,
        description="Expected number of training questions; data preparation stops if the file "
        "holds a different number. Null skips the check.",
    )
    val_questions: int | None = Field(
        default=None,
        ge=1,
        description="Expected number of validation questions; data preparation stops if the file "
        "holds a different number. Null skips the check.",
    )


class DataConfig(Strict):
    """Question inputs: GPQA CSV files and LiveCodeBench code_generation_lite JSONL files."""

    gpqa: SourceFiles = Field(description="GPQA CSV files in the upstream column layout.")
    lcb: SourceFiles = Field(description="LiveCodeBench code_generation_lite JSONL files.")
    max_private_tests_bytes: int = Field(
        default=256 * 2**20,
        ge=1024,
        description="Largest decoded size of one row's private tests; a compressed blob that "
        "inflates beyond it is refused (zip-bomb guard).",
    )


class ScheduleConfig(Strict):
    """The ordered training schedule: `steps` x `questions_per_step` slots over the train set."""

    steps: int = Field(ge=1, description="Number of training steps.")
    questions_per_step: int = Field(ge=1, description="Distinct questions drawn for each step.")
    seed: int = Field(
        default=0, ge=0, description="Seed of the per-epoch question order (explicit, recorded)."
    )
    shuffle: bool = Field(
        default=True,
        description="Shuffle the question pool once per epoch; false cycles it in file order "
        "(GPQA rows, then LCB rows).",
    )


class DataSlice(Strict):
    data: DataConfig = Field(description="Question inputs.")
    schedule: ScheduleConfig = Field(description="Ordered training schedule.")
