"""Sandboxed program runs (`graders`)."""

from __future__ import annotations

from pydantic import Field

from atlas.config.base import Strict


class GraderConfig(Strict):
    """Sandboxed program runs for the python / run_tests / submit tools and the LCB grader."""

    test_timeout_s: float = Field(default=6.0, gt=0, description="Wall-clock bound of one test run.")
    program_timeout_s: float = Field(
        default=30.0, gt=0, description="Wall-clock bound of all tests of one program together."
    )
    memory_mb: int = Field(default=1024, ge=64, description="Address-space limit of a program (RLIMIT_AS).")
    cpu_s: int = Field(default=10, ge=1, description="CPU-time limit of one program run (RLIMIT_CPU).")
    file_size_mb: int = Field(
        default=16, ge=1, description="Largest file a program may write (RLIMIT_FSIZE)."
    )
    open_files: int = Field(default=64, ge=16, description="Open file descriptors (RLIMIT_NOFILE).")
    max_output_bytes: int = Field(
        default=1 << 16, ge=1024, description="Stdout / stderr kept per run; the rest is dropped."
    )
    workers: int = Field(default=2, ge=1, description="Programs graded at once (bounded pool).")
    max_processes: int = Field(
        default=8,
        ge=2,
        description=(
            "Processes and threads a program may run at once in its sandbox (RLIMIT_NPROC); "
            "memory_mb x max_processes bounds a sandbox's memory, x workers the grader's."
        ),
    )
    scratch_mb: int = Field(
        default=64, ge=1, description="Size of a program's private scratch folder (its /tmp tmpfs)."
    )
    sandbox_uid_base: int = Field(
        default=1_900_000_000,
        ge=1000,
        le=4_000_000_000,
        description="First host uid of the sandboxes when the grader runs as root: each sandbox "
        "runs as this plus twice its grading thread's id plus its slot (0 or 1: the sandbox grading "
        "and the next one, started ahead), a uid nothing else on the machine uses.",
    )
    cpu_cores: float = Field(
        default=1.0,
        gt=0,
        description="CPU quota of one sandbox, in cores (its cgroup's cpu bound, where cgroups are "
        "available).",
    )
    scratch_inodes: int = Field(
        default=4096,
        ge=16,
        description="Files, folders and links a program's scratch folder holds at once (the tmpfs's "
        "nr_inodes, when the grader runs as root; otherwise the sandbox's cgroup memory bounds them).",
    )
    allow_unsandboxed: bool = Field(
        default=False,
        description="Run programs without the bubblewrap sandbox where it cannot start (under the "
        "driver alone, as the grader's user); every verdict and record then says sandboxed: false. "
        "Off, a grading stage stops at start when bubblewrap cannot run.",
    )
