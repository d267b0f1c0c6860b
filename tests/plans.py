"""Snakemake's job graph of a workflow copy, from one interpreter for many queries.

`job_graphs(workdir, queries)` starts one Python process that builds the DAG of the default
target once per query through the Snakemake API and returns, per job, its input files, the jobs
it waits for, and whether Snakemake would run it now. A query may edit source files first (the
edit is undone after the plan, content and modification time), so one process answers a whole
matrix of "edit this, what reruns?" questions.

The process runs in the copy, so the copy's own `src/` is the atlas package its Snakefile
imports (an edit there changes what the plan sees).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

GRAPH_SCRIPT = r"""
import json, os, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

def name(job):
    wc = ",".join(str(v) for v in job.wildcards)
    return f"{job.rule.name}[{wc}]" if wc else job.rule.name

answers = []
with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
    for query in json.loads(sys.stdin.read()):
        saved = {}
        for path in query.get("edit", []):
            p = Path(path)
            saved[p] = (p.read_bytes(), p.stat().st_mtime_ns)
            p.write_bytes(saved[p][0] + b"\n# an edit that changes no behaviour\n")
        try:
            wf = api.workflow(
                resource_settings=ResourceSettings(cores=1),
                config_settings=ConfigSettings(configfiles=[Path(c) for c in query.get("configfiles", [])]),
                snakefile=Path("Snakefile"),
                workdir=Path("."),
            )
            dag_api = wf.dag(dag_settings=DAGSettings(targets={"all"}))
            # The DAG as Snakemake plans it (what `--summary` prints), with each job's inputs.
            workflow = dag_api.workflow_api._workflow
            workflow._prepare_dag(forceall=False, ignore_incomplete=True, lock_warn_only=True)
            workflow._build_dag()
            dag = workflow.dag
            answers.append({
                name(j): {
                    "inputs": sorted(str(f) for f in j.input),
                    "after": sorted(name(d) for d in dag.dependencies[j]),
                    "needrun": bool(dag.needrun(j)),
                }
                for j in dag.jobs
            })
        finally:
            for p, (data, mtime) in saved.items():
                p.write_bytes(data)
                os.utime(p, ns=(mtime, mtime))
print(json.dumps(answers))
"""


def job_graphs(workdir: Path, queries: list[dict]) -> list[dict[str, dict]]:
    """One answer per query ({"configfiles": [...], "edit": [paths relative to workdir]}):
    job name ("train[zero_potential]") -> {"inputs", "after", "needrun"}."""
    proc = subprocess.run(
        [sys.executable, "-c", GRAPH_SCRIPT],
        input=json.dumps(queries),
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise AssertionError(f"planning failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def downstream_of(graph: dict[str, dict], path: str) -> set[str]:
    """The jobs an edit of `path` reruns: those that list it as an input, and every job after
    them (their inputs are rebuilt). The `all` target is left out."""
    hit = {job for job, d in graph.items() if path in d["inputs"]}
    grew = True
    while grew:
        more = {job for job, d in graph.items() if job not in hit and hit & set(d["after"])}
        hit |= more
        grew = bool(more)
    return hit - {"all"}


def to_run(graph: dict[str, dict]) -> set[str]:
    return {job for job, d in graph.items() if d["needrun"]} - {"all"}


# --- one planning process for the whole test session ---

PLANNER_SCRIPT = r"""
import contextlib, io, json, os, sys, traceback
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

answers = os.fdopen(int(sys.argv[1]), "w")
base_path = list(sys.path)
with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
    for line in sys.stdin:
        query = json.loads(line)
        try:
            os.chdir(query["workdir"])
            # Each workflow copy imports its own atlas package: forget the previous copy's.
            for name in [m for m in sys.modules if m == "atlas" or m.startswith("atlas.")]:
                del sys.modules[name]
            sys.path[:] = base_path
            wf = api.workflow(
                resource_settings=ResourceSettings(cores=1),
                config_settings=ConfigSettings(configfiles=[Path(p) for p in query["configfiles"]]),
                snakefile=Path("Snakefile"),
                workdir=Path("."),
            )
            dag = wf.dag(dag_settings=DAGSettings(targets=set(query["targets"])))
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                dag.summary(detailed=False)
            with contextlib.redirect_stdout(io.StringIO()):
                dag.execute_workflow(executor="dryrun")  # the plan must also pass a full dry run
            rows = [line.split("\t") for line in buf.getvalue().splitlines() if line.strip()]
            answer = {"rows": [dict(zip(rows[0], row)) for row in rows[1:]]}
        except BaseException:
            answer = {"error": traceback.format_exc()}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
"""


class Planner:
    """A Python process holding the Snakemake API that answers plan queries one line at a time,
    so a test session pays for one interpreter and one Snakemake import, not one per query.
    Before each query it forgets the atlas modules it imported, so the queried copy's own
    `src/` is what its Snakefile imports."""

    def __init__(self) -> None:
        import os
        import tempfile

        self._log = tempfile.TemporaryFile()
        read, write = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", PLANNER_SCRIPT, str(write)],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=self._log,
            text=True,
            pass_fds=(write,),
        )
        os.close(write)
        self._answers = os.fdopen(read)

    def rows(self, workdir: Path, targets: list[str], configfiles: list[str]) -> list[dict[str, str]]:
        query = {
            "workdir": str(Path(workdir).resolve()),
            "targets": targets,
            "configfiles": list(configfiles),
        }
        self._proc.stdin.write(json.dumps(query) + "\n")
        self._proc.stdin.flush()
        line = self._answers.readline()
        if not line:
            self._log.seek(0)
            raise AssertionError(
                f"the planning process ended:\n{self._log.read()[-4000:].decode(errors='replace')}"
            )
        answer = json.loads(line)
        if "error" in answer:
            raise AssertionError(f"planning {targets} in {workdir} failed:\n{answer['error']}")
        return answer["rows"]

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(timeout=60)


_PLANNER: Planner | None = None


def planner() -> Planner:
    """The session's planning process, started on first use."""
    global _PLANNER
    if _PLANNER is None or _PLANNER._proc.poll() is not None:
        _PLANNER = Planner()
        import atexit

        atexit.register(_PLANNER.close)
    return _PLANNER
