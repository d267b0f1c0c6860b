"""Mutation testing of the modules that carry the report's claims, with mutmut, module by module.

    python tools/mutation.py                 # every module in MODULES, then the score table
    python tools/mutation.py grammar losses  # some of them
    python tools/mutation.py --survivors     # also print each surviving mutant's diff

Each module runs in its own scratch copy of the repository (the tracked and untracked files, no
results), against its own fast unit tests only, so a run never touches the working tree and the
per-module scores do not mix. mutmut 3 mutates the copy's src/ into mutants/, records which test
reaches which function, then runs only those tests against each mutant in a worker forked from a
fork server that has imported torch and the runtime (PRELOAD). Modules whose tests need the tiny
model get it built once per run (PREBUILT); ONLY_FUNCTIONS scores some functions of a file. It
needs `pip install mutmut==3.8.1`; it is not a CI step and pytest never collects it (minutes of
CPU per module). mutmut runs with three operators of tools/mutation_ops.py beside its own: an
`if` always and never taken, a `while` never entered, a `for` over nothing. The table it prints is
the one in docs/testing.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# module label -> (source files mutated, the fast unit tests run against them)
MODULES: dict[str, tuple[list[str], list[str]]] = {
    "grammar": (
        ["src/atlas/runtime/grammar.py"],
        [
            "tests/unit/test_call_grammar.py",
            "tests/unit/test_runtime.py::test_control_tokens_are_illegal_in_the_grammar_itself",
            "tests/unit/test_runtime.py::test_surrogate_escapes_only_as_whole_pairs",
        ],
    ),
    "records": (["src/atlas/runtime/records.py"], ["tests/unit/test_record_files.py"]),
    "protocol": (["src/atlas/runtime/protocol.py"], ["tests/unit/test_protocol_checks.py"]),
    "rewards": (
        ["src/atlas/rl/rewards.py"],
        ["tests/unit/test_rl_math.py", "tests/unit/test_reward_edges.py"],
    ),
    "advantages": (
        ["src/atlas/rl/advantages.py"],
        ["tests/unit/test_rl_math.py", "tests/unit/test_gae_edges.py"],
    ),
    "losses": (["src/atlas/rl/losses.py"], ["tests/unit/test_rl_math.py", "tests/unit/test_loss_edges.py"]),
    "replay": (
        ["src/atlas/rl/replay.py"],
        ["tests/unit/test_replay.py", "tests/unit/test_masked_logprobs.py"],
    ),
    "checkpoint": (
        ["src/atlas/rl/checkpoint.py"],
        ["tests/unit/test_checkpoint.py", "tests/unit/test_checkpoint_edges.py"],
    ),
    "hashing": (
        ["src/atlas/hashing.py"],
        [
            "tests/unit/test_hashing.py",
            "tests/unit/test_hashing_edges.py",
            "tests/unit/test_hash_cache_edges.py",
            "tests/unit/test_integrity.py::test_hash_cache_is_used_only_while_the_file_is_unchanged",
        ],
    ),
    "sandbox_bounds": (["src/atlas/graders/sandbox.py"], ["tests/unit/test_sandbox_bounds.py"]),
    # only tests that start no sandbox: a mutant of the sandbox's own kill could signal every
    # process of the user
    "sandbox_host": (["src/atlas/graders/sandbox.py"], ["tests/unit/test_sandbox_host.py"]),
    "sandbox_run": (["src/atlas/graders/sandbox.py"], ["tests/unit/test_sandbox_run.py"]),
    "cgroups": (["src/atlas/graders/cgroups.py"], ["tests/unit/test_cgroups.py"]),
    "lcb": (
        ["src/atlas/graders/lcb.py"],
        [
            "tests/unit/test_lcb_verdicts.py",
            "tests/unit/test_graders.py::test_stdout_lines_compare_stripped_and_as_decimals",
            "tests/unit/test_graders.py::test_functional_wrong_answer_and_missing_method",
            "tests/unit/test_graders.py::test_crash_and_syntax_error_are_errors_with_their_message",
            "tests/unit/test_graders.py::test_a_long_correct_answer_passes_past_max_output_bytes",
            "tests/unit/test_sandbox_isolation.py::test_no_comparison_runs_before_every_test_has_run_and_the_sandbox_is_gone",
            "tests/unit/test_sandbox_isolation.py::test_what_depends_on_the_expected_outputs_is_worked_out_before_the_program_runs",
            "tests/unit/test_sandbox_isolation.py::test_judging_does_the_same_work_whether_an_output_is_right_or_wrong",
            "tests/unit/test_sandbox_isolation.py::test_a_returned_value_longer_than_any_equal_one_is_never_parsed",
        ],
    ),
    "gpqa": (
        ["src/atlas/graders/gpqa.py", "src/atlas/data/gpqa.py"],
        ["tests/unit/test_gpqa.py", "tests/unit/test_graders.py::test_grade_letter"],
    ),
    "schedule": (["src/atlas/data/schedule.py"], ["tests/unit/test_schedule.py"]),
    "tools": (
        ["src/atlas/runtime/tools.py"],
        # test_runtime.py builds tools at import: a mutant that breaks them stops its collection.
        ["tests/unit/test_tool_bounds.py"],
    ),
    "recovery": (
        ["src/atlas/rl/recovery.py"],
        [
            "tests/unit/test_resume_points.py",
            "tests/unit/test_recovery.py::test_bad_checkpoints_go_aside_with_why_and_the_good_ones_stay",
            "tests/unit/test_recovery.py::test_verl_checkpoints_are_sealed_then_checked",
            "tests/unit/test_verl_resume_episodes.py::test_the_resume_point_is_verls_tracker",
        ],
    ),
    "compact": (["src/atlas/checks/compact.py"], ["tests/unit/test_compact_checks.py"]),
    "grade_many": (
        ["src/atlas/graders/lcb.py"],
        [
            "tests/unit/test_graders.py::test_reference_solutions_pass_every_test",
            "tests/unit/test_graders.py::test_every_verdict_says_it_was_sandboxed",
            "tests/unit/test_graders.py::test_grade_many_keeps_input_order_and_grades_the_programs_at_once",
            "tests/unit/test_graders.py::test_grade_many_runs_each_program_in_a_sandbox_of_its_own",
            "tests/unit/test_graders.py::test_grade_many_starts_a_workers_next_sandbox_before_it_grades",
            "tests/unit/test_graders.py::test_grade_many_starts_nothing_ahead_when_each_worker_has_one_program",
        ],
    ),
    "drift": (["src/atlas/rl/drift.py"], ["tests/unit/test_drift.py"]),
    "journal": (
        ["src/atlas/rl/journal.py"],
        [
            "tests/unit/test_journal.py",
            "tests/unit/test_run_assembly.py",
            "tests/unit/test_step_journal.py",
            "tests/unit/test_stage_exit.py",
        ],
    ),
    "execute": (["src/atlas/runtime/execute.py"], ["tests/unit/test_execute.py"]),
    "potentials": (
        ["src/atlas/rl/potentials.py", "src/atlas/rl/snapshot.py"],
        ["tests/unit/test_rl_math.py", "tests/unit/test_snapshot_potential.py"],
    ),
    "regrade": (
        ["src/atlas/rl/regrade.py"],
        ["tests/unit/test_regrade_plan.py", "tests/unit/test_regrade_folder.py"],
    ),
    "prefix": (
        ["src/atlas/graders/prefix.py"],
        [
            "tests/unit/test_lcb_prefix.py::test_the_prefix_is_lcb_runners",
            "tests/unit/test_lcb_prefix.py::test_every_name_gets_the_object_the_whole_prefix_gives_it",
            "tests/unit/test_lcb_prefix.py::test_where_a_name_comes_from_when_several_lines_bind_it",
            "tests/unit/test_lcb_prefix.py::test_a_plain_program_gets_only_the_lines_that_load_nothing",
            "tests/unit/test_lcb_prefix.py::test_attributes_and_numbers_are_no_names",
            "tests/unit/test_lcb_prefix.py::test_a_source_that_can_reach_names_it_does_not_spell_gets_the_whole_prefix",
            "tests/unit/test_lcb_prefix.py::test_the_names_are_read_from_an_interpreter_started_as_the_sandbox_starts",
        ],
    ),
    "driver": (
        ["src/atlas/graders/driver.py"],
        [
            "tests/unit/test_driver_units.py",
            "tests/unit/test_lcb_prefix.py::test_the_drivers_done_frame_is_the_json_of_its_dict",
        ],
    ),
    "lcb_reader": (["src/atlas/data/lcb.py"], ["tests/unit/test_lcb.py", "tests/unit/test_lcb_rows.py"]),
    "roundtrip": (
        ["src/atlas/checks/roundtrip.py"],
        ["tests/unit/test_check_failures.py", "tests/unit/test_roundtrip_checks.py"],
    ),
}

# Modules of which only some functions count (the rest of the file is another job's: the sandbox's
# start-up and isolation are tested by running real sandboxes, seconds per mutant). mutmut
# mutates the whole file and runs every mutant that the selected tests reach; only these
# functions' mutants count, the others are left out of the score.
ONLY_FUNCTIONS: dict[str, set[str]] = {
    "sandbox_bounds": {"SandboxLimits.from_config", "_Capped.__init__", "_Capped.add", "_Capped.text"},
    # The host side that needs no sandbox started: the command line, what it hides, the uids,
    # the question locks, the sweep of unsandboxed scratch folders.
    "sandbox_host": {
        "_inside",
        "_hidden",
        "_root_binds",
        "_proc_cover_args",
        "_bwrap_command",
        "_claim_uid",
        "_release_uid",
        "_locks_folder",
        "lock_path",
        "QuestionLock.__init__",
        "QuestionLock.release",
        "scratch_prefix",
        "sweep_stale_scratch",
    },
    # One run in a started sandbox: the frames, the program's load, the RunResult, the start-up
    # check. The start and the kill (_spawn, _init_pid, close, sandboxed_processes) are left out:
    # a mutant there can signal processes that are not the sandbox's.
    "sandbox_run": {
        "_Frames.next",
        "Sandbox.load",
        "Sandbox._send",
        "Sandbox.run",
        "require_sandbox",
        "run_program",
    },
    # The comparison and the verdict; grade_many's pool of threads is left out.
    "lcb": {
        "_clip",
        "_stripped_lines",
        "_decimals",
        "_same_line",
        "compare_stdout",
        "compare_functional",
        "_failure_detail",
        "_keep_bytes",
        "_outcome",
        "_judge",
        "_check_tests",
        "_value_chars",
        "_kept",
        "grade_code",
        "_run_tests",
        "_judged",
        "summarize",
    },
    # The pool: the order of the verdicts, the sandboxes started ahead, the number of workers.
    "grade_many": {"grade_many"},
    # What the driver decides in its own process: the seccomp program, a returned value's JSON and
    # bounds, the exit status, the scratch folder's emptying, the frames. The rest runs only
    # inside a sandbox, where mutmut's mutants cannot (the sandbox tests run it there).
    "driver": {
        "seccomp_program",
        "to_json",
        "_value_of",
        "_exit_status",
        "wipe",
        "_read_exact",
        "read_frame",
        "write_all",
        "send",
        "done_json",
    },
}

# Modules whose tests use the tiny model and the prepared data: both are built once per run by
# the workflow's own rules in the unmutated scratch copy (`snakemake prepare_data
# build_tiny_model`: results/data, results/models/tiny) and handed to every mutant's session (tests/conftest.py reads
# ATLAS_TEST_TINY_MODEL and ATLAS_TEST_DATA_DIR), not rebuilt for each mutant (~1 min each).
PREBUILT = {"grammar", "replay", "checkpoint", "roundtrip"}
PREBUILD_RULES = ["prepare_data", "build_tiny_model"]
PREBUILT_DATA, PREBUILT_MODEL = "results/data", "results/models/tiny"

# An address-space bound (bytes) for mutmut and its workers, per module. A mutant that never
# leaves a loop and grows a list (the schedule's `item[0] not in taken`) fills the machine's memory
# long before mutmut's timeout; under the bound it stops with a MemoryError, a failing test.
ADDRESS_SPACE = {"schedule": 3500 << 20}

# What tests/conftest.py reads beside src/ and tests/ (the tiny model's config, the fixtures).
ALSO_COPY = ["config", "resources", "Snakefile", "rules", "profiles", "envs", "report"]

KILLED = {"killed", "caught by type check", "timeout"}  # detected: the tests failed or never ended
RESULT = re.compile(r"^\s+(?P<name>\S+): (?P<status>.+)$")


def scratch_copy(dest: Path) -> None:
    """The repository's files as git sees them (tracked and untracked, ignored ones left out)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for rel in filter(None, (p.decode() for p in listed)):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


# Imported once by mutmut's fork server, so that each mutant's forked worker starts with them: a
# test that imports the runtime lazily (Episode, the engine) would otherwise pay ~9 s of
# transformers and torch imports per mutant.
PRELOAD = [
    "torch",
    "transformers",
    "peft",
    "xgrammar",
    "safetensors.torch",
    "pyarrow.parquet",
    "pytest",
    "atlas.runtime.session",
    "atlas.runtime.episode",
    "atlas.runtime.engine",
    "atlas.rl.checkpoint",
    "atlas.rl.replay",
    "atlas.checks.roundtrip",
]


def mutated_function(name: str) -> str:
    """The function ("Class.method" or "function") of a mutmut mutant name such as
    atlas.graders.sandbox.xǁ_Cappedǁadd__mutmut_3 or atlas.rl.rewards.x_shape_episode__mutmut_1."""
    mangled = name.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[-1]
    if mangled.startswith("xǁ"):
        return ".".join(mangled[2:].split("ǁ"))
    return mangled[2:]


def only_patterns(label: str) -> list[str]:
    """mutmut's name patterns for the functions ONLY_FUNCTIONS scores: mutants of the others are
    generated and skipped (their tests may reach code whose mutants would signal processes that are
    not the sandbox's)."""
    patterns = []
    for function in sorted(ONLY_FUNCTIONS.get(label, ())):
        cls, _, name = function.rpartition(".")
        patterns.append(f"*.xǁ{cls}ǁ{name}__mutmut_*" if cls else f"*.x_{function}__mutmut_*")
    return patterns


def mutmut_config(sources: list[str], tests: list[str], preload: Path) -> str:
    quote = lambda xs: "[" + ", ".join(json.dumps(x) for x in xs) + "]"  # noqa: E731
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        # mutmut runs the tests in mutants/, a copy of src/ and tests/ only; the fixtures read the
        # workflow's config and resources from the repository root (tests/conftest.py's REPO).
        f"also_copy = {quote(ALSO_COPY)}\n"
        f"only_mutate = {quote(sources)}\n"
        f"pytest_add_cli_args_test_selection = {quote(tests)}\n"
        # One process: mutmut records which test reaches which function through hooks in its own
        # process, which pytest-xdist workers (pyproject's -n auto) would bypass.
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-n", "0"]\n'
        'process_isolation = "forkserver"\n'
        'forkserver_warmup = "import"\n'
        f'preload_modules_file = "{preload}"\n'
        "use_git_change_detection = false\n"
        # A mutant whose tests run past 3 x (their clean time + 5 s) of wall time (mutmut's bound:
        # (estimate + constant) x multiplier) never ends them: a loop whose exit it removed. The
        # suite does not pass, so it is detected, in a column of its own; a loaded machine alone
        # never reaches three times a test's own time.
        "timeout_multiplier = 3.0\n"
        "timeout_constant = 5.0\n"
    )


def run_module(label: str, sources: list[str], tests: list[str], children: int, survivors: bool) -> Counter:
    with tempfile.TemporaryDirectory(prefix=f"atlas-mutation-{label}-") as tmp:
        work = Path(tmp)
        scratch_copy(work)
        preload = work / "mutmut-preload.txt"
        preload.write_text("".join(f"{m}\n" for m in PRELOAD), encoding="utf-8")
        with open(work / "pyproject.toml", "a", encoding="utf-8") as f:
            f.write(mutmut_config(sources, tests, preload))
        # Subprocesses a test starts (the tiny model's build) import the scratch copy's atlas,
        # never the working tree's; mutmut's own workers import mutants/src first.
        env = {**os.environ, "PYTHONPATH": str(work / "src")}
        if label in PREBUILT:
            build = [sys.executable, "-m", "snakemake", *PREBUILD_RULES, "--cores", "2", "--quiet", "all"]
            subprocess.run(build, cwd=work, env=env, check=True)
            data, model = work / PREBUILT_DATA, work / PREBUILT_MODEL
            env |= {"ATLAS_TEST_TINY_MODEL": str(model), "ATLAS_TEST_DATA_DIR": str(data)}
        # mutmut's command line with the operators it lacks (a condition or a loop removed)
        mutmut = [sys.executable, str(REPO / "tools" / "mutation_ops.py")]
        bound = ADDRESS_SPACE.get(label)
        run = subprocess.run(
            [*mutmut, "run", "--max-children", str(children), *only_patterns(label)],
            cwd=work,
            env=env,
            preexec_fn=None
            if bound is None
            else lambda: resource.setrlimit(resource.RLIMIT_AS, (bound, bound)),
        )
        if run.returncode != 0:
            raise SystemExit(f"{label}: mutmut run exited {run.returncode}")
        listing = subprocess.run(
            [*mutmut, "results", "--all", "true"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        statuses = {m["name"]: m["status"] for m in map(RESULT.match, listing.splitlines()) if m}
        if label in ONLY_FUNCTIONS:  # the other functions' mutants were generated, never run
            statuses = {n: s for n, s in statuses.items() if mutated_function(n) in ONLY_FUNCTIONS[label]}
        if not statuses:
            raise SystemExit(f"{label}: mutmut listed no mutants:\n{listing}")
        for name, status in sorted(statuses.items()):
            if status not in KILLED:
                print(f"  {label}: {status}: {name}")
                if survivors:
                    shown = subprocess.run(
                        [*mutmut, "show", name], cwd=work, env=env, capture_output=True, text=True
                    )
                    print(shown.stdout)
        return Counter(statuses.values())


def _test_exists(test: str) -> bool:
    """Whether `path` or `path::name` is a test file of the repository and, named, a test in it."""
    path, _, name = test.partition("::")
    file = REPO / path
    return file.is_file() and (
        not name
        or re.search(rf"^def {re.escape(name)}\(", file.read_text(encoding="utf-8"), re.M) is not None
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", help=f"labels from {sorted(MODULES)} (default: all)")
    ap.add_argument("--children", type=int, default=2, help="mutants tested at once")
    ap.add_argument("--survivors", action="store_true", help="print each surviving mutant's diff")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.modules) - set(MODULES))
    if unknown:
        ap.error(f"unknown modules {unknown}; expected some of {sorted(MODULES)}")
    missing = [
        test
        for label in args.modules or list(MODULES)
        for test in MODULES[label][1]
        if not _test_exists(test)
    ]
    if missing:  # before minutes of mutmut's set-up end in its own error
        ap.error(f"the selection names tests that do not exist: {missing}")
    rows = []
    for label in args.modules or list(MODULES):
        sources, tests = MODULES[label]
        counts = run_module(label, sources, tests, args.children, args.survivors)
        total = sum(counts.values())
        killed = sum(n for status, n in counts.items() if status in KILLED)
        rows.append((label, total, killed, counts["timeout"], total - killed, 100.0 * killed / total))
        print(f"{label}: {killed} of {total} killed ({rows[-1][-1]:.1f}%)", flush=True)
    print("\n| module | mutants | killed | timeout | not killed | score |\n|---|---:|---:|---:|---:|---:|")
    for label, total, killed, timeouts, rest, score in rows:
        print(f"| {label} | {total} | {killed} | {timeouts} | {rest} | {score:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
