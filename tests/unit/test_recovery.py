"""Resume picks the last good checkpoint (bad ones are moved aside with a note, never deleted),
one writer per run folder (a second is refused naming the holder's pid), and a training job, like
every stage, dies with the process that started it."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from atlas.hashing import MANIFEST, write_manifest
from atlas.lifetime import WATCHDOG
from atlas.rl.recovery import RECOVERY, VERL_TRACKER, WHY, check_checkpoints, check_verl_checkpoints
from atlas.rl.runlock import RunLockedError, claim, lock_path
from conftest import REPO, alive, survivors


def fake_checkpoint(root: Path, step: int) -> Path:
    folder = root / f"step_{step}"
    folder.mkdir(parents=True)
    save_file({"w": torch.full((64,), float(step))}, str(folder / "actor.safetensors"))
    (folder / "state.json").write_text(json.dumps({"step": step}))
    write_manifest(folder, stage="compact_checkpoint", config={"step": step})
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_bad_checkpoints_go_aside_with_why_and_the_good_ones_stay(tmp_path):
    root = tmp_path / "checkpoints" / "run"
    for k in (1, 2, 3):
        fake_checkpoint(root, k)
    assert check_checkpoints(root, "run") is None
    three = snapshot(root / "step_3")
    actor = root / "step_3" / "actor.safetensors"
    actor.write_bytes(actor.read_bytes()[:-7])  # truncated
    (root / "step_2" / "state.json").write_text(json.dumps({"step": 9}))  # altered, same size
    event = check_checkpoints(root, "run")
    aside = tmp_path / "checkpoints" / "run.corrupt-1"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_1"]
    assert event["moved"] == ["step_2", "step_3"] and event["to"] == aside.as_posix()
    size = len(three["actor.safetensors"])
    assert event["why"]["step_3"][0] == f"{actor}: size {size - 7}, manifest says {size}"
    assert any("state.json: sha256" in p for p in event["why"]["step_2"])
    # never deleted: the truncated bytes are kept as they were, with the note
    moved = snapshot(aside / "step_3")
    assert moved["actor.safetensors"] == three["actor.safetensors"][:-7]
    assert {k: v for k, v in moved.items() if k != "actor.safetensors"} == {
        k: v for k, v in three.items() if k != "actor.safetensors"
    }
    assert json.loads((aside / WHY).read_text()) == event
    assert json.loads((root / RECOVERY).read_text()) == [event]
    # an incomplete one (no manifest) next time: a second folder, the log of both kept
    (root / "step_1" / MANIFEST).unlink()
    second = check_checkpoints(root, "run")
    assert second["to"] == (tmp_path / "checkpoints" / "run.corrupt-2").as_posix()
    assert second["why"]["step_1"] == [f"{root / 'step_1' / MANIFEST}: no manifest"]
    assert json.loads((root / RECOVERY).read_text()) == [event, second]
    assert not list(root.glob("step_*"))


def test_verl_checkpoints_are_sealed_then_checked(tmp_path):
    root = tmp_path / "run"
    folder = root / "verl" / "checkpoints"
    for g in (1, 2, 3):
        step = folder / f"global_step_{g}" / "actor"
        step.mkdir(parents=True)
        save_file({"lora_A": torch.ones(128) * g}, str(step / "model.safetensors"))
    (folder / VERL_TRACKER).write_text("2")  # step 3's save did not finish
    event = check_verl_checkpoints(root, folder, "run")
    assert event["moved"] == ["global_step_3"]
    assert (folder / VERL_TRACKER).read_text() == "2"  # the last good step of two, not the first
    assert (folder / "global_step_1" / MANIFEST).is_file() and (folder / "global_step_2" / MANIFEST).is_file()
    assert (tmp_path / "run.corrupt-1" / "verl" / "checkpoints" / "global_step_3").is_dir()
    assert check_verl_checkpoints(root, folder, "run") is None
    # a byte changed in a sealed step (same size) is caught; verl's tracker goes back one step
    shard = folder / "global_step_2" / "actor" / "model.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    event = check_verl_checkpoints(root, folder, "run")
    assert (
        event["moved"] == ["global_step_2"]
        and "model.safetensors: sha256" in event["why"]["global_step_2"][0]
    )
    assert (folder / VERL_TRACKER).read_text() == "1"
    # an unsealed truncated shard is caught by its safetensors header; none left: verl starts over
    (folder / "global_step_1" / MANIFEST).unlink()
    shard = folder / "global_step_1" / "actor" / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    event = check_verl_checkpoints(root, folder, "run")
    assert "truncated" in event["why"]["global_step_1"][0]
    assert not (folder / VERL_TRACKER).exists()
    assert len(json.loads((root / RECOVERY).read_text())) == 3


HOLDER = textwrap.dedent(
    """
    import sys, time
    from atlas.rl.runlock import claim
    claim(sys.argv[1], "run")
    print("held", flush=True)
    time.sleep(600)
    """
)


def test_a_second_writer_is_refused_naming_the_pid(tmp_path):
    root = tmp_path / "checkpoints" / "run"
    root.mkdir(parents=True)
    (root / "keep.txt").write_text("written before")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout.readline() == "held\n"
        start = time.monotonic()
        with pytest.raises(RunLockedError) as err:
            claim(root, "run")
        assert time.monotonic() - start < 1  # at once, no waiting
        assert f"run run is being written by pid {holder.pid}, which holds this lock" in str(err.value)
        assert str(lock_path(root)) in str(err.value)
    finally:
        holder.kill()
        holder.wait()
    assert (root / "keep.txt").read_text() == "written before"
    assert claim(root, "run") == lock_path(root)  # the lock goes with its holder
    assert lock_path(root).read_text() == f"{os.getpid()}\n"


CHILD = textwrap.dedent(
    """
    import errno, os, sys, time
    if sys.argv[1] == "no-pidfd":  # as on a kernel without pidfd_open (Linux before 5.3)
        def no_pidfd(pid):
            raise OSError(errno.ENOSYS, "pidfd_open")
        os.pidfd_open = no_pidfd
    from atlas.lifetime import die_with_parent
    die_with_parent()
    print("guarded", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize(
    ("through_shell", "watch"), [(False, "pidfd"), (True, "pidfd"), (True, "no-pidfd")], ids=str
)
def test_a_job_dies_with_the_process_that_started_it(tmp_path, through_shell, watch):
    """A starter (as Snakemake) runs the job, directly or through `bash -c`, and is SIGKILLed.
    Through a shell the job watches the starter through a pidfd, or reads /proc each second on a
    kernel without pidfd_open."""
    pidfile, script = tmp_path / "pid", tmp_path / "job.py"
    script.write_text(CHILD)
    if through_shell:
        inner = f"{sys.executable} {script} {watch} & echo $! > {pidfile}; wait"
        job = f"import subprocess; subprocess.run(['bash', '-c', {inner!r}])"
    else:
        job = (
            f"import subprocess, sys; p = subprocess.Popen([sys.executable, {str(script)!r}, {watch!r}]);"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); p.wait()"
        )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    starter = subprocess.Popen([sys.executable, "-c", job], env=env, stdout=subprocess.PIPE, text=True)
    assert starter.stdout.readline() == "guarded\n"
    while not pidfile.is_file() or not pidfile.read_text().strip():
        time.sleep(0.05)
    child = int(pidfile.read_text())
    assert alive(child)
    os.kill(starter.pid, signal.SIGKILL)
    starter.wait()
    assert survivors([child], 10) == []


RANK = textwrap.dedent(
    """
    import os, sys, time
    from atlas.lifetime import die_with_parent
    die_with_parent()
    with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"]), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
    """
)


@pytest.mark.parametrize("killed", ["starter", "torchrun"])
def test_every_rank_of_a_torchrun_job_dies_with_its_starter_or_torchrun(tmp_path, killed):
    """A starter (as Snakemake) runs `bash -c 'torchrun ...'` with two ranks; the starter or
    torchrun itself is SIGKILLed. No rank lives on (nor torchrun, whose ranks failed, when the
    starter went)."""
    script, pids = tmp_path / "rank.py", tmp_path / "pids"
    script.write_text(RANK)
    pids.mkdir()
    torchrun = f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node 2 {script} {pids}"
    inner = f"{torchrun} & echo $! > {pids / 'torchrun'}; wait"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    starter = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess; subprocess.run(['bash', '-c', {inner!r}])"], env=env
    )
    files = [pids / "torchrun", pids / "rank0", pids / "rank1"]
    deadline = time.monotonic() + 120
    while not all(f.is_file() and f.read_text().strip() for f in files):
        assert starter.poll() is None and time.monotonic() < deadline, [f.name for f in files if f.is_file()]
        time.sleep(0.1)
    launcher, *ranks = (int(f.read_text()) for f in files)
    assert all(alive(pid) for pid in [launcher, *ranks])
    # the killed starter is reaped only at the end: to the ranks, a zombie starter is gone
    os.kill(starter.pid if killed == "starter" else launcher, signal.SIGKILL)
    survived = survivors([launcher, *ranks] if killed == "starter" else ranks, 20)
    survivors([launcher, starter.pid], 0)  # leave nothing running behind a failed test
    starter.wait()
    assert survived == []


STAGES = sorted(p.stem for p in (REPO / "src/atlas/stages").glob("*.py") if p.stem != "__init__")


def _watched(pid: int) -> bool:
    """Whether pid runs atlas.lifetime's watchdog thread (named through prctl)."""
    try:
        return any(
            Path(t, "comm").read_text().strip() == WATCHDOG for t in Path(f"/proc/{pid}/task").iterdir()
        )
    except FileNotFoundError:
        return False


# Put first on PYTHONPATH, this holds a stage process when Python first looks for the stage's
# own module (atlas.stages has run by then, the stage module not yet): once its watchdog thread
# has named itself (10 s at most), it stops (SIGSTOP); continued, it sleeps 10 s before the stage
# goes on, time for the watchdog to end it.
HOLD = """
import os, signal, sys, time
from pathlib import Path

def watching():
    try:
        return any((t / "comm").read_text().strip() == "parent-watchdog" for t in Path("/proc/self/task").iterdir())
    except FileNotFoundError:  # a thread ended while listed
        return False

class Hold:
    def find_spec(self, name, path=None, target=None):
        if name.startswith("atlas.stages."):
            sys.meta_path.remove(self)
            deadline = time.monotonic() + 10
            while not watching() and time.monotonic() < deadline:
                time.sleep(0.001)
            os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(10)
        return None

sys.meta_path.insert(0, Hold())
"""


def _stopped(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return text[text.rindex(")") + 2] == "T"


def test_every_stage_ends_with_its_starter_from_its_first_moment(tmp_path):
    """Each stage as Snakemake runs it (`bash -c '... python -m atlas.stages.<rule> ...'`), held
    (stopped) as soon as atlas.stages has run, before the stage's module is found (HOLD): its
    watchdog thread runs by then. Its starter SIGKILLed and the stage continued, every stage ends
    by SIGTERM (exit status 143 in its shell) before it reads its arguments, none by its own exit
    2 on the missing arguments."""
    assert "train" in STAGES and "distributed_roundtrip" in STAGES and len(STAGES) >= 10, STAGES
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(HOLD)
    env = {**os.environ, "PYTHONPATH": f"{hold}{os.pathsep}{REPO / 'src'}", "OMP_NUM_THREADS": "1"}
    starters, stages = {}, {}
    for stage in STAGES:
        pid, status = tmp_path / f"{stage}.pid", tmp_path / f"{stage}.status"
        inner = f"{sys.executable} -m atlas.stages.{stage} 2>/dev/null & echo $! > {pid}; wait $!; echo $? > {status}"
        starters[stage] = subprocess.Popen(
            [sys.executable, "-c", f"import subprocess; subprocess.run(['bash', '-c', {inner!r}])"], env=env
        )
    try:
        deadline = time.monotonic() + 60
        while len(stages) < len(STAGES):
            for stage in set(STAGES) - set(stages):
                pid = tmp_path / f"{stage}.pid"
                text = pid.read_text().strip() if pid.is_file() else ""
                if text and _stopped(int(text)):
                    assert _watched(int(text)), stage  # the watchdog runs before the stage's module
                    stages[stage] = int(text)
            assert time.monotonic() < deadline, f"not held: {sorted(set(STAGES) - set(stages))}"
            time.sleep(0.01)
        for proc in starters.values():
            os.kill(proc.pid, signal.SIGKILL)
        time.sleep(0.2)
    finally:
        for pid in stages.values():
            os.kill(pid, signal.SIGCONT)
        for proc in starters.values():
            proc.kill()
            proc.wait()
    assert survivors(list(stages.values()), 20) == []
    deadline = time.monotonic() + 20
    while not all((tmp_path / f"{s}.status").is_file() for s in STAGES) and time.monotonic() < deadline:
        time.sleep(0.05)
    statuses = {s: (tmp_path / f"{s}.status").read_text().strip() for s in STAGES}
    assert statuses == {s: "143" for s in STAGES}


# The training stage in a fresh interpreter, up to its refusal: which of the libraries it had loaded.
REFUSED = """
import sys
from atlas.errors import InputError
import atlas.stages.train as stage
try:
    stage.main(sys.argv[1:])
except InputError as err:
    print(err)
    print(sorted({"torch", "transformers", "peft"} & set(sys.modules)))
"""


def test_training_refuses_a_second_writer_before_it_loads_torch(tmp_path, data_dir, tiny_model):
    """A second writer is named at once: the stage takes the run's lock before torch,
    transformers and peft load (about 5 s of CPU), and writes nothing. A RANK left in the
    environment of one process (no WORLD_SIZE) does not make it skip the lock."""
    import fcntl

    from atlas.config.study import config_slice, load_config

    s = config_slice(load_config(REPO / "config" / "config.yaml"), "training", "training_smoke")
    root = tmp_path / "checkpoints" / "training_smoke"
    args = ["--config-slice", json.dumps(s), "--checkpoints", str(root), "--out", str(tmp_path / "run")]
    args += ["--model", str(tiny_model)]
    for split in ("train", "val", "tests"):
        args += [f"--{split}", str(data_dir / f"{split}.parquet")]
    lock = lock_path(root)
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as held:  # another writer's lock, held by this process
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write(f"{os.getpid()}\n")
        held.flush()
        env = {**{k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}, "RANK": "3"}
        proc = subprocess.run(
            [sys.executable, "-c", REFUSED, *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env=env,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    message, loaded = proc.stdout.strip().splitlines()
    assert f"run training_smoke is being written by pid {os.getpid()}, which holds this lock" in message
    assert loaded == "[]"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]
    assert [p.name for p in root.parent.iterdir()] == [lock.name]
