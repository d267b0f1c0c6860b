"""The sandbox driver's own decisions, called in this process: the seccomp program run through a
classic-BPF interpreter written here, a returned value's JSON and its bounds, the child's exit
status, the scratch folder's emptying and the frames. The driver runs these inside the sandbox
(tests/unit/test_sandbox_*.py check the effect there); here each gets values worked out by hand.
The after-test kill is left to the sandbox tests: outside a PID namespace of its own, its
kill(-1) would reach every process of this user.
"""

from __future__ import annotations

import json
import marshal
import os
import struct
import threading
import time

import pytest

from atlas.graders import driver

ALLOW, EPERM = 0x7FFF0000, 0x00050001  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
X86_64, AARCH64, I386 = 0xC000003E, 0xC00000B7, 0x40000003  # AUDIT_ARCH_*

# System call numbers from the kernel's arch/x86/entry/syscalls/syscall_64.tbl.
X86_64_REFUSED = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
    "pidfd_open": 434, "kcmp": 312, "shmget": 29, "shmat": 30, "shmctl": 31, "msgget": 68,
    "semget": 64, "mq_open": 240, "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190,
    "add_key": 248, "request_key": 249, "keyctl": 250, "memfd_create": 319, "memfd_secret": 447,
    "perf_event_open": 298, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "unshare": 272, "setns": 308, "mount": 165,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "mount_setattr": 442, "flock": 73, "inotify_init": 253, "inotify_init1": 294,
    "inotify_add_watch": 254, "fanotify_init": 300, "fanotify_mark": 301, "mincore": 27,
    "cachestat": 451, "readahead": 187, "fadvise64": 221, "preadv2": 327, "pwritev2": 328,
    "process_madvise": 440, "sync": 162, "syncfs": 306, "sysinfo": 99, "fsync": 74,
    "fdatasync": 75, "sync_file_range": 277, "msync": 26, "sched_setaffinity": 203,
    "io_setup": 206, "io_destroy": 207, "io_getevents": 208, "io_submit": 209, "io_cancel": 210,
    "io_pgetevents": 333,
}  # fmt: skip
X86_64_ALLOWED = {
    "read": 0, "write": 1, "close": 3, "fstat": 5, "mmap": 9, "munmap": 11, "clone": 56,
    "fork": 57, "execve": 59, "exit": 60, "wait4": 61, "kill": 62, "getpid": 39,
    "exit_group": 231, "openat": 257, "pipe2": 293, "clone3": 435, "getrandom": 318,
    "sched_getaffinity": 204, "setsockopt": 54,
}  # fmt: skip
SOCKET, SOCKETPAIR, FCNTL, MADVISE, GETSOCKOPT, PRCTL = 41, 53, 72, 28, 55, 157  # x86_64


def run_filter(program: bytes, nr: int, args: tuple[int, ...] = (), arch: int = X86_64) -> int:
    """What the filter returns for one call: struct seccomp_data {int nr; u32 arch; u64 ip;
    u64 args[6]} (little-endian) run through the four classic-BPF instructions the driver
    emits, each interpreted by its definition (linux/filter.h)."""
    data = struct.pack("<iIQ", nr, arch, 0) + b"".join(
        struct.pack("<Q", a % (1 << 64)) for a in (*args, *[0] * (6 - len(args)))
    )
    code = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    assert len(program) % 8 == 0 and len(code) <= 4096
    pc, acc = 0, 0
    for _ in range(len(code)):  # classic BPF only jumps forward: a run is at most one pass
        op, jt, jf, k = code[pc]
        if op == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            (acc,) = struct.unpack_from("<I", data, k)
            pc += 1
        elif op == 0x15:  # BPF_JMP | BPF_JEQ | BPF_K
            pc += 1 + (jt if acc == k else jf)
        elif op == 0x35:  # BPF_JMP | BPF_JGE | BPF_K
            pc += 1 + (jt if acc >= k else jf)
        elif op == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"instruction {op:#x} at {pc}")
    raise AssertionError("the program ran past its end")


@pytest.fixture
def child_filter() -> bytes:  # made anew for each test, so each test calls seccomp_program
    return driver.seccomp_program("x86_64")


def test_the_childs_filter_refuses_exactly_the_listed_calls(child_filter):
    for name, nr in X86_64_REFUSED.items():
        assert run_filter(child_filter, nr) == EPERM, name
    for name, nr in X86_64_ALLOWED.items():
        assert run_filter(child_filter, nr) == ALLOW, name
    refused = {nr for nr in range(460) if run_filter(child_filter, nr) == EPERM}
    assert refused == set(X86_64_REFUSED.values()) | {SOCKET, SOCKETPAIR}  # bare: AF_UNSPEC (0)


def test_getsockopt_and_prctl_are_refused_by_option(child_filter):
    SOL_SOCKET, SO_TYPE, SO_RCVBUF, SO_COOKIE = 1, 3, 8, 57
    assert run_filter(child_filter, GETSOCKOPT, (3, SOL_SOCKET, SO_COOKIE)) == EPERM
    assert run_filter(child_filter, GETSOCKOPT, (3, SOL_SOCKET, SO_COOKIE | 1 << 32)) == EPERM
    for option in (SO_TYPE, SO_RCVBUF):
        assert run_filter(child_filter, GETSOCKOPT, (3, SOL_SOCKET, option)) == ALLOW
    PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_SET_NAME, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 3, 4, 15, 38, 22
    assert run_filter(child_filter, PRCTL, (PR_SET_DUMPABLE, 1)) == EPERM
    for option in (PR_GET_DUMPABLE, PR_SET_NAME, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP):
        assert run_filter(child_filter, PRCTL, (option, 0)) == ALLOW


def test_another_abi_is_refused_whatever_its_number(child_filter):
    assert run_filter(child_filter, 0, arch=I386) == EPERM  # a 32-bit `int 0x80` read
    assert run_filter(child_filter, 0, arch=AARCH64) == EPERM
    assert run_filter(child_filter, 0x40000000) == EPERM  # x32: read with the x32 bit
    assert run_filter(child_filter, 0x40000000 | 39) == EPERM
    assert run_filter(child_filter, 0x3FFFFFFF) == ALLOW  # just below it: an unknown call, ENOSYS


def test_sockets_of_unix_only_and_the_argument_read_as_an_int(child_filter):
    AF_UNIX, AF_INET, AF_NETLINK, AF_VSOCK = 1, 2, 16, 40
    assert run_filter(child_filter, SOCKET, (AF_UNIX, 1, 0)) == ALLOW
    assert run_filter(child_filter, SOCKETPAIR, (AF_UNIX, 1, 0)) == ALLOW
    for family in (0, AF_INET, AF_NETLINK, AF_VSOCK, 3):
        assert run_filter(child_filter, SOCKET, (family, 1, 0)) == EPERM, family
        assert run_filter(child_filter, SOCKETPAIR, (family, 1, 0)) == EPERM, family
    # The kernel reads the int's low 32 bits: bits above it change nothing
    assert run_filter(child_filter, SOCKET, (AF_VSOCK | 1 << 32, 1, 0)) == EPERM
    assert run_filter(child_filter, SOCKET, (AF_UNIX | 1 << 40, 1, 0)) == ALLOW


def test_fcntl_and_madvise_are_refused_by_command(child_filter):
    # F_GETLK 5, F_SETLK 6, F_SETLKW 7, F_OFD_GETLK 36 .. F_OFD_SETLKW 38, F_SETLEASE 1024,
    # F_GETLEASE 1025, F_NOTIFY 1026
    for command in (5, 6, 7, 36, 37, 38, 1024, 1025, 1026):
        assert run_filter(child_filter, FCNTL, (3, command)) == EPERM, command
    # F_DUPFD 0, F_GETFD 1, F_SETFD 2, F_GETFL 3, F_SETFL 4, F_DUPFD_CLOEXEC 1030, F_SETPIPE_SZ 1031
    for command in (0, 1, 2, 3, 4, 1030, 1031):
        assert run_filter(child_filter, FCNTL, (3, command)) == ALLOW, command
    # MADV_WILLNEED 3, MADV_COLD 20, MADV_PAGEOUT 21, MADV_POPULATE_READ 22, _WRITE 23
    for advice in (3, 20, 21, 22, 23):
        assert run_filter(child_filter, MADVISE, (0, 4096, advice)) == EPERM, advice
    for advice in (0, 1, 2, 4, 8, 14):  # NORMAL, RANDOM, SEQUENTIAL, DONTNEED, FREE, HUGEPAGE
        assert run_filter(child_filter, MADVISE, (0, 4096, advice)) == ALLOW, advice


def test_the_drivers_filter_allows_its_stdin_memfd_and_pidfd_only():
    names = [n for n in driver.DENIED if n not in driver.DRIVER_NEEDS]
    program = driver.seccomp_program("x86_64", names)
    assert run_filter(program, X86_64_REFUSED["memfd_create"]) == ALLOW
    assert run_filter(program, X86_64_REFUSED["pidfd_open"]) == ALLOW
    rest = {k: v for k, v in X86_64_REFUSED.items() if k not in ("memfd_create", "pidfd_open")}
    assert all(run_filter(program, nr) == EPERM for nr in rest.values())


def test_the_aarch64_table():
    program = driver.seccomp_program("aarch64")
    # include/uapi/asm-generic/unistd.h; aarch64 has no inotify_init (the one without flags)
    refused = {"ptrace": 117, "memfd_create": 279, "mount": 40, "flock": 32, "inotify_init1": 26,
               "mincore": 232, "sync": 81, "syncfs": 267, "sysinfo": 179, "setns": 268, "bpf": 280,
               "io_setup": 0, "io_submit": 2, "fsync": 82, "msync": 227, "sched_setaffinity": 122}  # fmt: skip
    for name, nr in refused.items():
        assert run_filter(program, nr, arch=AARCH64) == EPERM, name
    for name, nr in {"read": 63, "write": 64, "openat": 56, "clone": 220, "getpid": 172}.items():
        assert run_filter(program, nr, arch=AARCH64) == ALLOW, name
    assert run_filter(program, 198, (1,), arch=AARCH64) == ALLOW  # socket(AF_UNIX)
    assert run_filter(program, 198, (40,), arch=AARCH64) == EPERM
    assert run_filter(program, 209, (3, 1, 57), arch=AARCH64) == EPERM  # getsockopt SO_COOKIE
    assert run_filter(program, 167, (4, 1), arch=AARCH64) == EPERM  # prctl PR_SET_DUMPABLE
    assert run_filter(program, 63, arch=X86_64) == EPERM  # the x86_64 ABI on an aarch64 filter
    assert run_filter(program, 0x40000000 | 63, arch=AARCH64) == ALLOW  # no x32 rule there


# --- a returned value ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None, True, 0, -7, 2**70, 1.5, -0.0, "", "é\n\"", [], {}, [1, [2, [3]]],
        {"a": [1, None], "b": {"c": "d"}}, (1, (2, "x")), [[]] * 3,
    ],
)  # fmt: skip
def test_a_value_becomes_jsons_own_text(value):
    assert driver.to_json(value) == json.dumps(value)


def test_the_length_cap_counts_the_text_it_would_build():
    value = {"ab": [1, 22, "x"], "c": None}
    text = json.dumps(value)  # '{"ab": [1, 22, "x"], "c": null}'
    assert driver.to_json(value, cap=len(text)) == text
    with pytest.raises(ValueError, match=f"longer than {len(text) - 1} characters"):
        driver.to_json(value, cap=len(text) - 1)
    empties = [[], {}, [[]], ""]  # '[[], {}, [[]], ""]': an empty container is two characters
    assert driver.to_json(empties, cap=len(json.dumps(empties))) == json.dumps(empties)
    shared = ["xyz"] * 4  # one object four times: each time counted
    assert driver.to_json(shared, cap=len(json.dumps(shared))) == json.dumps(shared)
    with pytest.raises(ValueError, match="longer than"):
        driver.to_json(shared, cap=len(json.dumps(shared)) - 1)


def nested(levels: int) -> list:
    v: list = []
    for _ in range(levels):
        v = [v]
    return v


def doubling(levels: int) -> list:
    """A list whose JSON has 2**levels leaves, of `levels` distinct objects: marshal carries it in a
    few hundred bytes."""
    v: list = []
    for _ in range(levels):
        v = [v, v]
    return v


def test_a_value_of_few_objects_and_a_long_text_is_sized_once_per_object():
    with pytest.raises(ValueError, match="^its JSON is longer than 16777216 characters$"):
        driver.to_json(doubling(40))  # 2**40 leaves: only counting each object once ends this


def test_a_deep_value_is_refused_before_the_recursion_goes_deep():
    # 3,000 levels: deeper than this interpreter's recursion limit, so only stopping at level 101
    # gives the bound's own message
    with pytest.raises(ValueError, match="^it is nested deeper than 100 levels$"):
        driver.to_json(nested(3000))


def test_the_depth_bound_holds_on_every_path():
    assert driver.to_json(nested(driver.VALUE_DEPTH_CAP)) == json.dumps(nested(driver.VALUE_DEPTH_CAP))
    with pytest.raises(ValueError, match="nested deeper than 100 levels"):
        driver.to_json(nested(driver.VALUE_DEPTH_CAP + 1))
    chain = nested(60)  # 60 levels below it
    with pytest.raises(ValueError, match="nested deeper"):  # first met 1 down, then 41 down: 101
        driver.to_json([chain, wrapped(chain, 40)])
    fits = [chain, wrapped(chain, 39)]  # 40 down, 60 below it: 100 levels
    assert driver.to_json(fits) == json.dumps(fits)
    holder = {"k": chain}  # a dict is a level too
    with pytest.raises(ValueError, match="nested deeper"):
        driver.to_json([holder, wrapped(holder, 39)])
    assert driver.to_json([holder, wrapped(holder, 38)]) == json.dumps([holder, wrapped(holder, 38)])


def wrapped(value, levels: int) -> list:
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value, why",
    [
        ({1, 2}, "set"),
        (float("nan"), "float"),
        (float("inf"), "float"),
        ([float("-inf")], "float"),
        ({1: "a"}, "dict with non-string keys"),
        (b"bytes", "bytes"),
        (1j, "complex"),
    ],
)
def test_what_json_has_not_is_refused(value, why):
    with pytest.raises(ValueError, match=f"^{why}$"):
        driver.to_json(value)


def test_a_value_that_contains_itself_is_refused():
    loop: list = [1]
    loop.append([loop])
    with pytest.raises(ValueError, match="^it contains itself$"):
        driver.to_json(loop)
    mapping: dict = {}
    mapping["me"] = mapping
    with pytest.raises(ValueError, match="^it contains itself$"):
        driver.to_json(mapping)


def framed(value) -> bytes:
    payload = marshal.dumps(value)
    return struct.pack(">Q", len(payload)) + payload


def test_what_the_child_wrote_becomes_the_value_or_why_not():
    assert driver._value_of(framed([1, "a"])) == ('[1, "a"]', "")
    assert driver._value_of(b"") == (None, "")  # the child wrote nothing: its exit tells
    assert driver._value_of(framed(1)[:7]) == (None, "")
    assert driver._value_of(framed([1, 2])[:-1]) == (None, "the return value was cut off")
    for after in (b"4\n", b"4"):  # one byte after the value is one too many
        assert driver._value_of(framed(3) + after) == (
            None,
            "the program wrote to stdout after the method returned",
        )
    # a header saying 0 bytes follow: a value of nothing, which marshal cannot read
    assert driver._value_of(struct.pack(">Q", 0)) == (
        None,
        "the return value is not JSON-serialisable (EOF read where object expected)",
    )
    # a size past 2**63 (unsigned): more than was written
    assert driver._value_of(struct.pack(">Q", (1 << 63) + 5) + b"[]") == (
        None,
        "the return value was cut off",
    )
    assert driver._value_of(framed({1, 2})) == (None, "the return value is not JSON-serialisable (set)")
    assert driver._value_of(framed(nested(101))) == (
        None,
        "the return value is too large (it is nested deeper than 100 levels)",
    )
    truncated = marshal.dumps([1, 2, 3])[:-2]
    assert driver._value_of(struct.pack(">Q", len(truncated)) + truncated)[1].startswith(
        "the return value is not JSON-serialisable ("
    )


@pytest.mark.parametrize(
    "code, status, printed", [(None, 0, ""), (3, 3, ""), (256 + 7, 7, ""), ("bye", 1, "bye\n")]
)
def test_an_exit_status_is_the_interpreters(code, status, printed, capsys):
    assert driver._exit_status(SystemExit(code)) == status
    assert capsys.readouterr().err == printed


# --- the scratch folder and the frames -------------------------------------------------------------


def test_wipe_empties_the_folder_whatever_the_program_left(tmp_path):
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    scratch.mkdir()
    outside.mkdir()
    (outside / "kept").write_text("mine")
    (scratch / "file").write_text("x")
    deep = scratch
    for _ in range(300):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "leaf").write_text("y")
    (scratch / "locked" / "inner").mkdir(parents=True)
    (scratch / "locked" / "inner" / "f").write_text("z")
    os.chmod(scratch / "locked" / "inner", 0)
    os.chmod(scratch / "locked", 0)
    os.symlink(outside, scratch / "to-outside")  # a link is removed, never followed
    os.symlink(outside / "kept", scratch / "to-file")
    fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    try:
        driver.wipe(fd)
    finally:
        os.close(fd)
    assert os.listdir(scratch) == []
    assert sorted(os.listdir(outside)) == ["kept"] and (outside / "kept").read_text() == "mine"


def test_frames_cross_a_pipe_whole_whatever_the_reads_return():
    r, w = os.pipe()
    payload = bytes(range(256)) * 700  # more than the pipe holds: the reads come back short

    def write() -> None:
        driver.send(w, b"O", payload)
        driver.send(w, b"D", b"")
        os.close(w)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert driver.read_frame(r) == (b"O", payload)
        assert driver.read_frame(r) == (b"D", b"")
        assert driver.read_frame(r) is None  # the writer is gone: no frame, not a short one
    finally:
        writer.join(timeout=30)
        os.close(r)
    # a frame that arrives in two writes, the second with the next frame behind it: each read
    # asks for what the frame still lacks, never more
    r, w = os.pipe()
    first, second = driver.HEADER.pack(b"T", 10) + b"12345", b"67890" + driver.HEADER.pack(b"D", 2) + b"ok"

    def write_in_two() -> None:
        os.write(w, first)
        time.sleep(0.2)
        os.write(w, second)
        os.close(w)

    writer = threading.Thread(target=write_in_two)
    writer.start()
    try:
        assert driver.read_frame(r) == (b"T", b"1234567890")
        assert driver.read_frame(r) == (b"D", b"ok")
    finally:
        writer.join(timeout=30)
        os.close(r)
    r, w = os.pipe()
    os.write(w, driver.HEADER.pack(b"T", 10) + b"12345")  # a frame cut short
    os.close(w)
    assert driver.read_frame(r) is None
    os.close(r)
