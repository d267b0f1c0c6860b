"""The sandbox's host side as values, without starting one: the bwrap command line, what of the
host it hides, the uids of sandboxes, the question locks and their folder.

What these arguments do to a program (isolation, bounds) is what test_sandbox_isolation.py and
test_sandbox_attacks.py check inside real sandboxes; these tests pin the arguments themselves, so
that a flag dropped or a value swapped shows here in milliseconds."""

from __future__ import annotations

import glob
import hashlib
import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from atlas.graders import sandbox
from atlas.graders.sandbox import (
    ENV,
    MOUNT_SCRATCH,
    PREFIX,
    SANDBOX_UID,
    STAGE_PYTHON,
    STAGE_SCRATCH,
    QuestionLock,
    SandboxLimits,
    SandboxUnavailable,
    _bwrap_command,
    _claim_uid,
    _hidden,
    _inside,
    _proc_cover_args,
    _proc_covers,
    _release_uid,
    _root_binds,
    lock_path,
    sweep_stale_scratch,
)

LIMITS = SandboxLimits(2.0, 256, 2, 1, 16, 4096, scratch_mb=9, scratch_inodes=333)
BWRAP = "/opt/fake/bwrap"


def pairs(args: list[str] | tuple[str, ...], flag: str) -> list[tuple[str, ...]]:
    """The values that follow each `flag` in a command line (two for --ro-bind, one otherwise)."""
    width = 2 if flag in {"--ro-bind", "--bind", "--symlink", "--setenv"} else 1
    return [tuple(args[i + 1 : i + 1 + width]) for i, a in enumerate(args) if a == flag]


# --- what the sandbox sees ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "tree", "inside"),
    [("/usr/lib", "/usr", True), ("/usr", "/usr", True), ("/usrx/lib", "/usr", False), ("/", "/usr", False)],
)
def test_a_path_is_inside_a_tree_by_whole_components(path, tree, inside):
    assert _inside(path, tree) is inside


def test_the_working_directory_and_this_package_are_hidden_inside_the_bound_trees(tmp_path, monkeypatch):
    work = tmp_path / "workflow"
    work.mkdir()
    monkeypatch.chdir(work)
    hidden = _hidden([str(tmp_path)])
    assert str(work.resolve()) in hidden
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(sandbox.__file__))))
    assert src not in hidden  # not inside the trees given
    assert str(work.resolve()) not in _hidden(["/nowhere"])
    assert src in _hidden([src])


def test_a_folder_holding_the_interpreter_or_its_stdlib_is_never_hidden(monkeypatch):
    monkeypatch.chdir(PREFIX)  # the working directory is the interpreter's prefix
    hidden = _hidden([PREFIX])
    assert PREFIX not in hidden
    assert not any(_inside(sandbox.PYTHON, h) for h in hidden)
    # what is hidden there is the prefix's installed packages, not its stdlib
    purelib = os.path.realpath(sandbox.sysconfig.get_path("purelib", vars={"base": PREFIX}))
    assert (purelib in hidden) == os.path.isdir(purelib)


def test_the_root_is_usr_its_links_and_the_prefix_read_only_with_packages_covered():
    args = _root_binds("/the/prefix/source")
    assert args[:3] == ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64"):
        path = f"/{top}"
        if os.path.islink(path):
            assert (os.readlink(path), path) in pairs(args, "--symlink")
        elif os.path.isdir(path):
            assert (path, path) in pairs(args, "--ro-bind")
        else:
            assert path not in args
    if not _inside(PREFIX, "/usr"):
        assert ("/the/prefix/source", PREFIX) in pairs(args, "--ro-bind")
    trees = ["/usr"] if _inside(PREFIX, "/usr") else ["/usr", PREFIX]
    covered = [p for (p,) in pairs(args, "--tmpfs")]
    assert covered == [p for (p,) in pairs(args, "--remount-ro")] == _hidden(trees) != []


def test_top_level_folders_that_are_not_links_are_bound_and_a_prefix_under_usr_is_not_bound_again(
    monkeypatch,
):
    monkeypatch.setattr(sandbox.os.path, "islink", lambda path: False)
    monkeypatch.setattr(sandbox, "PREFIX", "/usr")
    monkeypatch.setattr(sandbox, "_hidden", lambda trees: [])
    tops = [f"/{t}" for t in ("bin", "sbin", "lib", "lib32", "lib64") if os.path.isdir(f"/{t}")]
    assert tops  # /bin at least
    expected = ["--ro-bind", "/usr", "/usr"] + [a for t in tops for a in ("--ro-bind", t, t)]
    assert _root_binds("/elsewhere") == expected


def test_the_package_folders_of_usr_and_of_the_prefix_are_hidden():
    """Read with glob and the interpreter's own version, not with the code's listdir and sysconfig."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    usr = {
        path
        for pattern in ("/usr/lib/python*/dist-packages", "/usr/lib/python*/site-packages")
        + ("/usr/local/lib/python*/dist-packages", "/usr/local/lib/python*/site-packages")
        for path in map(os.path.realpath, glob.glob(pattern))
        if os.path.isdir(path)
    }
    assert set(_hidden(["/usr"])) == usr
    ours = {os.path.realpath(f"{PREFIX}/lib/{version}/site-packages")}
    hidden = _hidden([PREFIX])
    assert ours <= set(hidden) and not any(_inside(h, "/usr") for h in hidden if not _inside(PREFIX, "/usr"))


def test_a_library_root_that_is_not_there_is_passed_over(monkeypatch):
    real_isdir = os.path.isdir
    monkeypatch.setattr(sandbox.os.path, "isdir", lambda path: path != "/usr/local/lib" and real_isdir(path))
    assert not any(_inside(path, "/usr/local/lib") for path in _hidden(["/usr"]))


def test_procs_shared_counters_are_covered_and_the_programs_own_entries_stay():
    args = _proc_cover_args()
    files = [p for _, p in pairs(args, "--ro-bind")]
    assert all(source == "/dev/null" for source, _ in pairs(args, "--ro-bind"))
    folders = [p for (p,) in pairs(args, "--tmpfs")]
    assert folders == [p for (p,) in pairs(args, "--remount-ro")]
    for name in ("stat", "loadavg", "meminfo", "uptime", "vmstat"):
        assert f"/proc/{name}" in files
    assert "/proc/sys" in folders
    for name in ("self", "thread-self", "version", "filesystems", str(os.getpid()), "mounts", "net"):
        assert f"/proc/{name}" not in files + folders
    # every entry not kept is covered, each once, in the order of its name
    expected = []
    for name in sorted(os.listdir("/proc")):
        path = f"/proc/{name}"
        if name.isdigit() or name in sandbox.PROC_KEPT or os.path.islink(path):
            continue
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode) or mode & stat.S_IROTH:
            expected.append(path)
    assert sorted(files + folders) == expected and len(set(files + folders)) == len(expected)


def test_a_proc_that_hides_its_global_entries_stops_the_sandbox(monkeypatch):
    names = [n for n in os.listdir("/proc") if n != "stat"]
    monkeypatch.setattr(sandbox.os, "listdir", lambda _: names)
    with pytest.raises(
        SandboxUnavailable,
        match=r"^this host's /proc hides its global entries \(subset=pid\?\): cannot tell which to cover$",
    ):
        _proc_cover_args()


# --- the command line ------------------------------------------------------------------------------


def inner_command(scratch: list[str], driver_args: list[str], prefix_source: str) -> list[str]:
    """The sandbox's own bwrap, written out flag by flag."""
    env = {**ENV, "HOME": "/tmp", "TMPDIR": "/tmp"}
    return [
        BWRAP,
        "--unshare-all",
        "--unshare-user",
        "--as-pid-1",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        "65534",
        "--gid",
        "65534",
        *_root_binds(prefix_source),
        "--proc",
        "/proc",
        *_proc_covers(),
        "--dev",
        "/dev",
        "--tmpfs",
        "/dev/pts",
        "--remount-ro",
        "/dev/pts",
        "--remount-ro",
        "/dev",
        *scratch,
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
        "--clearenv",
        *[a for k, v in env.items() for a in ("--setenv", k, v)],
        "--",
        *driver_args,
    ]


@pytest.fixture
def tools(monkeypatch):
    where = {"bwrap": BWRAP, "sh": "/opt/fake/sh", "setpriv": "/usr/bin/setpriv"}
    monkeypatch.setattr(sandbox.shutil, "which", where.get)
    return where


def test_an_unprivileged_grader_runs_one_bwrap_with_a_sized_scratch(tools, monkeypatch):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    command = _bwrap_command(LIMITS, 7, ["python", "-S", "boot"], uid=None)
    inner = inner_command(["--size", str(9 << 20), "--tmpfs", "/tmp"], ["python", "-S", "boot"], PREFIX)
    assert command == [BWRAP, "--info-fd", "7", *inner[1:]]
    assert SANDBOX_UID == 65534 and ENV == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}


def test_a_root_grader_stages_the_prefix_and_an_inode_bounded_scratch_then_drops_to_the_uid(
    tools, monkeypatch
):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    command = _bwrap_command(LIMITS, 5, ["python", "boot"], uid=1_900_000_042)
    stage = [BWRAP, "--info-fd", "5", "--unshare-pid", "--dev-bind", "/", "/", "--tmpfs", "/tmp"]
    stage += ["--ro-bind", PREFIX, STAGE_PYTHON, "--dir", STAGE_SCRATCH, "--die-with-parent", "--"]
    scratch = ["/opt/fake/sh", "-c", MOUNT_SCRATCH, "atlas-scratch", str(9 << 20), "333", "1900000042"]
    drop = ["/usr/bin/setpriv", "--reuid=1900000042", "--regid=1900000042", "--clear-groups"]
    drop += ["--pdeathsig=SIGKILL", "--"]
    inner = inner_command(["--bind", STAGE_SCRATCH, "/tmp"], ["python", "boot"], STAGE_PYTHON)
    assert command == [*stage, *scratch, *drop, *inner]
    assert MOUNT_SCRATCH.startswith('mount -t tmpfs -o "size=$1,nr_inodes=$2,mode=0700,uid=$3,gid=$3" ')


def test_a_root_grader_without_sh_or_setpriv_on_path_names_them_plainly(tools, monkeypatch):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    del tools["sh"], tools["setpriv"]
    command = _bwrap_command(LIMITS, 5, ["python"], uid=7)
    assert command[command.index("-c") - 1] == "/bin/sh"
    assert command[command.index("--reuid=7") - 1] == "setpriv"


def test_without_bwrap_on_path_the_command_line_is_refused(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda _: None)
    with pytest.raises(SandboxUnavailable, match=r"^bwrap \(Debian package bubblewrap\) is not on PATH$"):
        _bwrap_command(LIMITS, 3, ["python"], uid=None)


# --- host uids ---------------------------------------------------------------------------------------


def test_a_thread_gets_two_uids_of_its_own_then_a_clear_error():
    got: dict[str, object] = {}

    def claim(name: str) -> None:
        uids = [_claim_uid(5000), _claim_uid(5000)]
        with pytest.raises(RuntimeError, match="at most 2 sandboxes at once"):
            _claim_uid(5000)
        _release_uid(uids[0])
        again = _claim_uid(5000)  # the slot let go is the one given again
        got[name] = (threading.get_native_id(), uids, again)
        for uid in (uids[1], again):
            _release_uid(uid)

    threads = [threading.Thread(target=claim, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == ["a", "b"]  # an exception in a thread leaves its entry out
    for tid, uids, again in got.values():
        assert uids == [5000 + 2 * tid, 5000 + 2 * tid + 1] and again == uids[0]
    assert sandbox._uids_taken == set()


# --- question locks ---------------------------------------------------------------------------------


@pytest.fixture
def lock_parent(tmp_path, monkeypatch):
    parent = tmp_path / "run-lock"
    parent.mkdir()
    monkeypatch.setattr(sandbox, "LOCK_PARENTS", (str(tmp_path / "absent"), str(parent), "/tmp"))
    return parent


def test_the_lock_folder_is_the_first_parent_there_made_private(lock_parent):
    folder = lock_parent / f"atlas-grading-{os.geteuid()}"
    assert sandbox._locks_folder() == str(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o757)  # widened by something of this user: put back
    assert sandbox._locks_folder() == str(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    key = "lcb:q1"
    assert lock_path(key) == str(folder / hashlib.sha256(key.encode("utf-8")).hexdigest()[:32])
    assert lock_path("lcb:q1") != lock_path("lcb:q2")


def test_a_parent_that_is_a_file_or_not_writable_is_passed_over_and_a_private_folder_left_alone(
    tmp_path, monkeypatch
):
    a_file, locked, free = tmp_path / "a-file", tmp_path / "locked", tmp_path / "free"
    a_file.write_text("")
    locked.mkdir()
    free.mkdir()
    monkeypatch.setattr(sandbox, "LOCK_PARENTS", (str(a_file), str(locked), str(free)))
    asked: list[tuple[str, int]] = []

    def access(path: str, mode: int) -> bool:
        asked.append((path, mode))
        return path != str(locked)

    monkeypatch.setattr(sandbox.os, "access", access)
    chmods: list[str] = []
    real_chmod = os.chmod
    monkeypatch.setattr(sandbox.os, "chmod", lambda path, mode: (chmods.append(path), real_chmod(path, mode)))
    folder = free / f"atlas-grading-{os.geteuid()}"
    assert sandbox._locks_folder() == str(folder)
    assert (str(locked), os.W_OK | os.X_OK) in asked
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and chmods == []  # made private, not fixed after
    assert sandbox._locks_folder() == str(folder) and chmods == []


@pytest.mark.parametrize("kind", ["link", "file"])
def test_a_lock_folder_that_is_a_link_or_a_file_is_refused(lock_parent, tmp_path, kind):
    folder = lock_parent / f"atlas-grading-{os.geteuid()}"
    if kind == "link":
        (tmp_path / "elsewhere").mkdir()
        folder.symlink_to(tmp_path / "elsewhere")
    else:
        folder.write_text("")
    with pytest.raises(SandboxUnavailable, match="not a folder of this user"):
        sandbox._locks_folder()


def test_no_writable_parent_for_the_locks_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "LOCK_PARENTS", (str(tmp_path / "a"), str(tmp_path / "b")))
    with pytest.raises(SandboxUnavailable, match=f"none of {tmp_path}/a, {tmp_path}/b is a writable folder"):
        sandbox._locks_folder()


def test_a_question_lock_excludes_a_second_holder_until_released_then_its_file_goes(lock_parent):
    first = QuestionLock("q")
    assert os.stat(first.path).st_ino == os.fstat(first.fd).st_ino
    other = QuestionLock("another question")  # another key never waits
    other.release()
    got: list[QuestionLock] = []
    waiter = threading.Thread(target=lambda: got.append(QuestionLock("q")))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and got == []  # it waits while the lock is held
    first.release()
    assert first.fd is None
    waiter.join(10)
    assert not waiter.is_alive() and len(got) == 1
    second = got[0]
    # it woke on the file the first holder removed, and took the one there now
    assert os.stat(second.path).st_ino == os.fstat(second.fd).st_ino
    second.release()
    second.release()  # a second release changes nothing
    assert not os.path.exists(second.path) and os.listdir(os.path.dirname(second.path)) == []


def test_a_lock_file_is_private_and_an_interrupted_wait_leaves_no_descriptor(lock_parent, monkeypatch):
    lock = QuestionLock("q")
    assert stat.S_IMODE(os.stat(lock.path).st_mode) == 0o600
    lock.release()
    opened: list[int] = []

    def interrupted(fd: int, op: int) -> None:
        opened.append(fd)
        raise KeyboardInterrupt

    monkeypatch.setattr(sandbox.fcntl, "flock", interrupted)
    with pytest.raises(KeyboardInterrupt):
        QuestionLock("q")
    # the descriptor the wait was on is closed (its number may since name another file, never the lock)
    assert len(opened) == 1
    try:
        held = os.readlink(f"/proc/self/fd/{opened[0]}")
    except FileNotFoundError:
        held = None
    assert held != lock_path("q")


def test_the_lock_file_is_never_followed_through_a_link(lock_parent, tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    os.symlink(target, lock_path("q"))
    with pytest.raises(OSError):
        QuestionLock("q")
    assert target.read_text() == "keep"


def test_many_holders_of_one_key_never_overlap(lock_parent):
    inside, most, errors = [0], [0], []
    count = threading.Lock()

    def hold() -> None:
        try:
            for _ in range(20):
                lock = QuestionLock("shared")
                with count:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.001)
                with count:
                    inside[0] -= 1
                lock.release()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and most == [1] and inside == [0]
    assert os.listdir(os.path.dirname(lock_path("shared"))) == []


def test_the_unsandboxed_scratch_prefix_names_the_grader_process():
    assert sandbox.scratch_prefix() == f"atlas-sandbox-{os.getpid()}-"
    assert sandbox.scratch_prefix(42) == "atlas-sandbox-42-"
    assert sandbox.SCRATCH_NAME.fullmatch(sandbox.scratch_prefix(42) + "ab_9") is not None


def test_the_stale_scratch_sweep_touches_only_its_own_folders_and_never_raises(tmp_path, monkeypatch):
    root = tmp_path / "tmp"
    root.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    names = {
        "absurd": "atlas-sandbox-" + "9" * 20 + "-abc",  # raised OverflowError in every grader start
        "dead": f"atlas-sandbox-{dead.pid}-abc",
        "alive": f"atlas-sandbox-{os.getpid()}-abc",
        "foreign": f"atlas-sandbox-{dead.pid}-xyz",
        "link": f"atlas-sandbox-{dead.pid}-lnk",
    }
    target = tmp_path / "not-scratch"
    target.mkdir()
    (target / "keep").write_text("x")
    for key, name in names.items():
        if key == "link":
            os.symlink(target, root / name)
        else:
            (root / name).mkdir()
    if os.geteuid() == 0:
        os.chown(root / names["foreign"], 4321, 4321)
    removed = sweep_stale_scratch(str(root))
    assert removed == [names["dead"]]
    left = sorted(os.listdir(root))
    assert left == sorted(n for k, n in names.items() if k != "dead")
    assert (target / "keep").read_text() == "x"
    monkeypatch.setattr(os, "listdir", lambda _: (_ for _ in ()).throw(PermissionError("no")))
    assert sweep_stale_scratch(str(root)) == []  # an unreadable folder: nothing, and no raise


def test_the_sweep_goes_on_past_an_entry_that_vanished_and_never_raises_from_a_removal(tmp_path, monkeypatch):
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone, stale = f"atlas-sandbox-{dead.pid}-gone", f"atlas-sandbox-{dead.pid}-stale"
    (tmp_path / stale).mkdir()
    monkeypatch.setattr(sandbox.os, "listdir", lambda _: [gone, stale])  # gone: removed meanwhile
    removals: list[str] = []

    def rmtree(path: str, ignore_errors: bool = False) -> None:
        removals.append(path)
        if not ignore_errors:
            raise PermissionError(path)

    monkeypatch.setattr(sandbox.shutil, "rmtree", rmtree)
    assert sweep_stale_scratch(str(tmp_path)) == [stale]
    assert removals == [str(tmp_path / stale)]
