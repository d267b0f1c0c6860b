"""Sandbox cgroups without a sandbox: where they go (parsed from written-out mount tables), the
bound each file gets, and real cgroups of this host made, joined, killed, swept and removed.

test_sandbox_isolation.py checks what the bounds do to a program inside bubblewrap; these tests
pin the layout and the values, and run in milliseconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from atlas.graders import cgroups
from atlas.graders.cgroups import CONTROLLERS, Cgroup, Layout


def write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


# --- where this process's cgroups are -----------------------------------------------------------------


def test_a_hybrid_hosts_folders_come_from_the_v1_mounts_and_the_unified_one(tmp_path):
    for folder in ("unifiedX", "pids", "memory/abc", "cpu,cpuset/job:1X"):
        (tmp_path / folder).mkdir(parents=True)
    mountinfo = write(
        tmp_path / "mountinfo",
        "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
        "malformed line\n"
        "23 1 0:22 / /no/separator rw,nosuid\n"
        f"24 1 0:23 / {tmp_path}/not-a-cgroup rw - tmpfs tmpfs rw,memory\n"  # another type's options
        f"30 25 0:26 / {tmp_path}/unifiedX/ rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        f"35 25 0:31 / {tmp_path}/pids rw,nosuid - cgroup none rw,pids\n"
        f"36 25 0:32 /process_api {tmp_path}/memory rw,nosuid - cgroup cgroup rw,memory\n"
        f"37 25 0:33 / {tmp_path}/cpu,cpuset rw,nosuid - cgroup cgroup rw,cpuset,cpu\n"
        f"38 25 0:34 / {tmp_path}/pids-again rw,nosuid - cgroup cgroup rw,pids\n",  # the first mount wins
    )
    membership = write(
        tmp_path / "cgroup",
        "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n1:cpuset,cpu:/job:1X\n0::/\n",
    )
    assert cgroups._own_folders(mountinfo, membership) == {
        "": f"{tmp_path}/unifiedX",
        "pids": f"{tmp_path}/pids",
        "memory": f"{tmp_path}/memory/abc",  # the mount's root taken off the path
        "cpu": f"{tmp_path}/cpu,cpuset/job:1X",  # a ':' in the path, a controller after one not kept
    }


def test_the_tables_are_read_as_the_file_systems_names_whatever_the_locale(tmp_path):
    """A folder named in UTF-8 under an ASCII locale (LC_ALL=C, no coercion, no UTF-8 mode): read
    as UTF-8 it could not be found, read as ASCII it raised."""
    (tmp_path / "cg" / "jöb").mkdir(parents=True)
    mountinfo = write(tmp_path / "mountinfo", f"30 25 0:26 / {tmp_path}/cg rw - cgroup2 cgroup2 rw\n")
    membership = write(tmp_path / "cgroup", "0::/jöb\n")
    code = "import sys; from atlas.graders import cgroups; d = cgroups._own_folders(*sys.argv[1:]); print(list(d), *d.values())"
    env = {
        **os.environ,
        "LC_ALL": "C",
        "PYTHONCOERCECLOCALE": "0",
        "PYTHONIOENCODING": "utf-8:surrogateescape",
    }
    proc = subprocess.run(
        [sys.executable, "-X", "utf8=0", "-c", code, mountinfo, membership],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"[''] {tmp_path}/cg/jöb\n"


def test_a_v2_hosts_folder_is_its_unified_path_under_a_namespaced_root(tmp_path):
    (tmp_path / "cg" / "job" / "step").mkdir(parents=True)
    mountinfo = write(tmp_path / "mountinfo", f"30 25 0:26 /user.slice {tmp_path}/cg/ rw - cgroup2 none rw\n")
    inside = write(tmp_path / "inside", "0::/user.slice/job/step\n")
    assert cgroups._own_folders(mountinfo, inside) == {"": f"{tmp_path}/cg/job/step"}
    at_root = write(tmp_path / "at-root", "0::/user.slice\n")
    assert cgroups._own_folders(mountinfo, at_root) == {"": f"{tmp_path}/cg"}
    # a path not under the mount's root is kept whole; a folder that is not there is left out
    beside = write(tmp_path / "beside", "0::/job\n")
    assert cgroups._own_folders(mountinfo, beside) == {"": f"{tmp_path}/cg/job"}
    gone = write(tmp_path / "gone", "0::/user.slice/elsewhere\n")
    assert cgroups._own_folders(mountinfo, gone) == {}


@pytest.fixture
def v2(tmp_path, monkeypatch):
    monkeypatch.delenv(cgroups.PARENT_ENV, raising=False)
    folder = tmp_path / "v2"
    folder.mkdir()
    (folder / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (folder / "cgroup.subtree_control").write_text("io\n")
    return folder


def test_a_v2_parent_gives_its_children_the_controllers(v2):
    assert cgroups._v2_parent(str(v2)) == (str(v2), "")
    assert (v2 / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"


def test_a_v2_parent_whose_children_have_the_controllers_is_left_as_it_is(v2, monkeypatch):
    (v2 / "cgroup.subtree_control").write_text("cpu io memory pids\n")
    writes: list[tuple[str, str]] = []
    monkeypatch.setattr(cgroups, "_write", lambda path, text: writes.append((path, text)))
    assert cgroups._v2_parent(str(v2)) == (str(v2), "") and writes == []
    (v2 / "cgroup.subtree_control").write_text("memory pids cpu\n")  # exactly the three
    assert cgroups._v2_parent(str(v2)) == (str(v2), "") and writes == []
    (v2 / "cgroup.subtree_control").write_text("memory pids\n")
    assert cgroups._v2_parent(str(v2)) == (str(v2), "")
    assert writes == [(f"{v2}/cgroup.subtree_control", "+memory +pids +cpu")]


def test_the_delegated_cgroup_named_in_the_environment_comes_first(v2, tmp_path, monkeypatch):
    monkeypatch.setenv(cgroups.PARENT_ENV, str(v2))
    assert cgroups._v2_parent(str(tmp_path / "own")) == (str(v2), "")


def test_a_v2_parent_without_the_controllers_is_named_with_the_way_out(tmp_path, monkeypatch):
    fake = tmp_path / "cg"
    fake.mkdir()
    (fake / "cgroup.controllers").write_text("cpuset io\n")
    monkeypatch.setenv(cgroups.PARENT_ENV, str(fake))
    parent, why = cgroups._v2_parent(None)
    assert parent is None and why == f"cgroup v2 at {fake} does not offer memory, pids, cpu"
    (fake / "cgroup.controllers").write_text("memory pids cpu io\n")
    (fake / "cgroup.subtree_control").write_text("memory pids cpu\n")
    assert cgroups._v2_parent(None) == (str(fake), "")


def test_a_v2_parent_that_cannot_be_read_or_is_absent_says_why(v2, tmp_path):
    assert cgroups._v2_parent(None) == (None, "no cgroup v2 hierarchy is mounted")
    (v2 / "cgroup.subtree_control").unlink()
    parent, why = cgroups._v2_parent(str(v2))
    assert parent is None
    assert why == (
        f"cgroup v2 at {v2} cannot give its children memory, pids, cpu (No such file or directory); "
        f"set {cgroups.PARENT_ENV} to a cgroup delegated to the grader (systemd: Delegate=yes)"
    )
    (v2 / "cgroup.controllers").write_text("memory io\n")
    assert cgroups._v2_parent(str(v2)) == (None, f"cgroup v2 at {v2} does not offer pids, cpu")


@pytest.fixture
def found(monkeypatch):
    """layout() over the folders a test gives as this process's; the sweep it starts recorded."""
    swept: list[Layout] = []
    monkeypatch.setattr(cgroups, "sweep", swept.append)

    def layout(own: dict[str, str] | OSError) -> Layout:
        def folders() -> dict[str, str]:
            if isinstance(own, OSError):
                raise own
            return own

        monkeypatch.setattr(cgroups, "_own_folders", folders)
        before = len(swept)
        result = cgroups.layout.__wrapped__()
        assert swept[before:] == ([] if isinstance(own, OSError) else [result])
        return result

    return layout


def test_v1_hierarchies_hold_their_controllers_and_the_unified_one_gives_the_kill(found, tmp_path):
    own = {c: str(tmp_path / c) for c in CONTROLLERS} | {"": str(tmp_path / "unified")}
    for folder in own.values():
        os.mkdir(folder)
    assert found(own) == Layout({c: own[c] for c in CONTROLLERS}, frozenset(), own[""], "")


def test_controllers_missing_from_v1_come_from_v2(found, v2, tmp_path):
    (tmp_path / "memory").mkdir()
    own = {"memory": str(tmp_path / "memory"), "": str(v2)}
    assert found(own) == Layout(
        {"memory": own["memory"], "pids": str(v2), "cpu": str(v2)}, frozenset({"pids", "cpu"}), None, ""
    )
    assert found({"": str(v2)}) == Layout({c: str(v2) for c in CONTROLLERS}, frozenset(CONTROLLERS), None, "")


def test_what_cannot_be_bounded_is_named_with_why(found, v2, tmp_path, monkeypatch):
    (v2 / "cgroup.controllers").write_text("memory\n")
    assert found({"": str(v2)}) == Layout(
        {},
        frozenset(),
        str(v2),
        f"no per-sandbox memory, pids, cpu bound: cgroup v2 at {v2} does not offer pids, cpu",
    )
    assert found({}).missing == "no per-sandbox memory, pids, cpu bound: no cgroup v2 hierarchy is mounted"
    # a v1 hierarchy this user cannot write to
    own = {c: str(tmp_path / c) for c in CONTROLLERS}
    monkeypatch.setattr(cgroups.os, "access", lambda path, _: path != own["pids"])
    assert found(own) == Layout(
        {"memory": own["memory"], "cpu": own["cpu"]},
        frozenset(),
        None,
        f"no per-sandbox pids bound: the cgroup v1 pids hierarchy at {own['pids']} is not writable by this user",
    )
    assert found(OSError(2, "No such file", "/proc/self/mountinfo")) == Layout(
        {}, frozenset(), None, "no cgroups: [Errno 2] No such file: '/proc/self/mountinfo'"
    )


# --- the bounds each cgroup gets ---------------------------------------------------------------------


def bound(
    tmp_path, held: set[str], v2: set[str], cores: float, existing: tuple[str, ...] = ()
) -> dict[str, str]:
    folder = tmp_path / "cg"
    folder.mkdir()
    for name in existing:
        (folder / name).write_text("max")
    group = Cgroup.__new__(Cgroup)
    group.layout = Layout({c: str(tmp_path) for c in held}, frozenset(v2), None, "")
    group._bound(str(folder), held, 300 << 20, 12, cores)
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def test_v2_files_get_memory_without_swap_the_task_count_and_the_cpu_quota(tmp_path):
    assert bound(tmp_path, set(CONTROLLERS), set(CONTROLLERS), 1.5, ("memory.swap.max",)) == {
        "cpu.max": "150000 100000",
        "memory.max": str(300 << 20),
        "memory.swap.max": "0",
        "pids.max": "12",
    }


def test_v2_without_swap_accounting_writes_no_swap_file(tmp_path):
    assert bound(tmp_path, {"memory"}, {"memory"}, 1.0) == {"memory.max": str(300 << 20)}


def test_v1_files_bound_memory_and_swap_together_and_the_cfs_quota(tmp_path):
    assert bound(tmp_path, set(CONTROLLERS), set(), 0.25, ("memory.memsw.limit_in_bytes",)) == {
        "cpu.cfs_period_us": "100000",
        "cpu.cfs_quota_us": "25000",
        "memory.limit_in_bytes": str(300 << 20),
        "memory.memsw.limit_in_bytes": str(300 << 20),
        "pids.max": "12",
    }
    (tmp_path / "no-swap").mkdir()
    assert bound(tmp_path / "no-swap", {"memory"}, set(), 1.0) == {"memory.limit_in_bytes": str(300 << 20)}


def test_a_tiny_cpu_share_still_gets_the_kernels_least_quota(tmp_path):
    assert bound(tmp_path, {"cpu"}, {"cpu"}, 0.001) == {"cpu.max": "1000 100000"}


# --- real cgroups of this host -----------------------------------------------------------------------


@pytest.fixture
def real():
    found = cgroups.layout()
    assert found.missing == "", found.missing  # CI and the GPU nodes bound every sandbox
    return found


def sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"])


def test_a_real_cgroup_holds_its_bounds_and_its_close_kills_and_removes_everything(real):
    group = Cgroup(96 << 20, 9, 0.5)
    try:
        parents = sorted({*real.parents.values(), *([real.unified] if real.unified else [])})
        assert group.folders == [f"{p}/{group.name}" for p in parents]
        assert group.name.startswith(f"atlas-sandbox-{cgroups.pid_namespace()}-{os.getpid()}-")
        assert group.procs_files == [f"{f}/cgroup.procs" for f in group.folders]
        names = {"memory": "memory.max", "pids": "pids.max", "cpu": "cpu.max"}
        if "memory" not in real.v2:
            names |= {"memory": "memory.limit_in_bytes"}
        if "cpu" not in real.v2:
            names |= {"cpu": "cpu.cfs_quota_us"}
        values = {c: open(group.file(c, names[c])).read().strip() for c in CONTROLLERS}
        quota = "50000 100000" if "cpu" in real.v2 else "50000"
        assert values == {"memory": str(96 << 20), "pids": "9", "cpu": quota}
        children = [sleeper(), sleeper()]
        for procs in group.procs_files:
            for child in children:
                with open(procs, "w") as f:
                    f.write(str(child.pid))
        assert all(cgroups._pids(f) == sorted(c.pid for c in children) for f in group.folders)
    finally:
        group.close()
    assert [child.wait(10) for child in children] == [-9, -9]
    assert group.folders == [] and not any(os.path.exists(f"{p}/{group.name}") for p in parents)
    assert group.file("memory", "x") == f"{real.parents['memory']}/{group.name}/x"
    assert group.file("nothing", "x") is None


def test_a_host_without_a_unified_hierarchy_gets_one_cgroup_per_v1_controller(real, monkeypatch):
    pids = real.parents["pids"]
    monkeypatch.setattr(cgroups, "layout", lambda: Layout({"pids": pids}, real.v2 & {"pids"}, None, ""))
    group = Cgroup(96 << 20, 5, 1.0)
    try:
        namespace = int(os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]"))
        assert cgroups.NAME.fullmatch(group.name).groups() == (str(namespace), str(os.getpid()))
        assert group.folders == [f"{pids}/{group.name}"]
        assert open(f"{pids}/{group.name}/pids.max").read().strip() == "5"
    finally:
        group.close()
    assert not os.path.exists(f"{pids}/{group.name}")


def test_the_sweep_removes_only_the_cgroups_of_graders_that_are_gone(real):
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive, inside = sleeper(), sleeper()
    # The parent may be a cgroup tree shared with other containers on the host, each with its own
    # pid namespace: every name here is one that nothing else on the host can hold.
    parent, ns, tag = real.parents["pids"], cgroups.pid_namespace(), uuid.uuid4().int % 10**12
    names = {
        "dead": f"atlas-sandbox-{ns}-{dead.pid}-{tag}",
        "own": f"atlas-sandbox-{ns}-{os.getpid()}-{tag}",
        "alive": f"atlas-sandbox-{ns}-{alive.pid}-{tag}",
        "other namespace": f"atlas-sandbox-{ns + 1}-{dead.pid}-{tag}",
        "foreign": f"someone-else-{tag}",
    }
    for name in names.values():
        os.mkdir(f"{parent}/{name}")
    try:
        with open(f"{parent}/{names['dead']}/cgroup.procs", "w") as f:
            f.write(str(inside.pid))
        layout = Layout({"pids": parent}, real.v2 & {"pids"}, None, "")
        assert f"{parent}/{names['dead']}" in cgroups.sweep(layout)
        assert inside.wait(10) == -9 and alive.poll() is None
        assert [os.path.isdir(f"{parent}/{n}") for n in names.values()] == [False, True, True, True, True]
        assert cgroups.sweep(layout) == []  # nothing of this namespace left to sweep
        assert cgroups.sweep(Layout({"pids": f"{parent}/absent"}, frozenset(), None, "")) == []
    finally:
        alive.kill()
        for name in names.values():
            if os.path.isdir(f"{parent}/{name}"):
                os.rmdir(f"{parent}/{name}")


def test_a_process_is_alive_until_reaped_and_an_absurd_pid_counts_as_alive():
    child, running = subprocess.Popen(["true"]), sleeper()
    assert cgroups._alive(os.getpid()) is True
    assert cgroups._alive(running.pid) is True
    assert running.poll() is None  # asking sent it nothing
    running.kill()
    child.wait()
    assert cgroups._alive(child.pid) is False
    assert cgroups._alive(10**20) is True  # never swept on a guess


def test_a_cgroup_that_stays_busy_is_left_for_the_next_sandbox_to_retry(tmp_path, monkeypatch):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "held").write_text("")  # rmdir fails as on a cgroup whose last process is not released
    kills: list[str] = []
    monkeypatch.setattr(cgroups, "_kill_all", kills.append)
    monkeypatch.setattr(cgroups, "REMOVE_S", 0.05)
    monkeypatch.setattr(cgroups, "_left", [])
    start = time.monotonic()
    cgroups._remove(str(busy))
    assert 0.05 <= time.monotonic() - start < 5
    assert cgroups._left == [str(busy)] and set(kills) == {str(busy)} and len(kills) >= 2
    kills.clear()
    cgroups._retry_left()  # still busy: killed again, kept for the next
    assert cgroups._left == [str(busy)] and kills == [str(busy)]
    (busy / "held").unlink()
    cgroups._retry_left()
    assert cgroups._left == [] and not busy.exists()
    cgroups._left.append(str(busy))  # already gone: nothing to do, nothing kept
    cgroups._retry_left()
    assert cgroups._left == []


def test_what_is_missing_is_said_once_per_process_and_nothing_when_all_is_bounded(monkeypatch, capsys):
    monkeypatch.setattr(cgroups, "_told", False)
    monkeypatch.setattr(cgroups, "layout", lambda: Layout({}, frozenset(), None, ""))
    cgroups.say_missing_once()
    assert capsys.readouterr().err == "" and cgroups._told is False
    monkeypatch.setattr(
        cgroups, "layout", lambda: Layout({}, frozenset(), None, "no per-sandbox cpu bound: x")
    )
    cgroups.say_missing_once()
    cgroups.say_missing_once()
    assert capsys.readouterr().err == "atlas sandbox: no per-sandbox cpu bound: x\n"
