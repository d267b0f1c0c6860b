"""The sandbox's bounds as values: every limit of the `graders` config reaches SandboxLimits under
its own name, and the output cap keeps exactly the first bytes and says when it dropped some.

The limits' effect on a real program (RLIMIT_AS, CPU, file size, processes, the output cap) is
what tests/test_graders.py checks inside bubblewrap; these tests pin the arithmetic around it."""

from __future__ import annotations

import os

import pytest

from atlas.config.graders import GraderConfig
from atlas.graders.sandbox import SandboxLimits, _Capped

# Every field a value no other field has, so a limit read from the wrong key shows.
CFG = GraderConfig(
    test_timeout_s=2.5,
    program_timeout_s=7.5,
    memory_mb=515,
    cpu_s=3,
    file_size_mb=2,
    open_files=33,
    max_output_bytes=4097,
    max_processes=7,
    scratch_mb=9,
    sandbox_uid_base=3001,
    allow_unsandboxed=True,
    cpu_cores=0.75,
    scratch_inodes=333,
)


def test_every_limit_comes_from_its_own_config_key():
    assert SandboxLimits.from_config(CFG) == SandboxLimits(
        timeout_s=2.5,
        memory_mb=515,
        cpu_s=3,
        file_size_mb=2,
        open_files=33,
        max_output_bytes=4097,
        max_processes=7,
        scratch_mb=9,
        uid_base=3001,
        allow_unsandboxed=True,
        cpu_cores=0.75,
        scratch_inodes=333,
    )


def test_the_default_configuration_is_what_the_dataclass_defaults_say():
    limits = SandboxLimits.from_config(GraderConfig())
    fields = ("max_processes", "scratch_mb", "uid_base", "allow_unsandboxed", "cpu_cores", "scratch_inodes")
    assert [getattr(limits, f) for f in fields] == [getattr(SandboxLimits, f) for f in fields]
    assert (limits.allow_unsandboxed, limits.cpu_cores, limits.scratch_inodes) == (False, 1.0, 4096)


def test_a_sandbox_cgroup_bounds_program_scratch_and_driver_together(monkeypatch):
    # memory_mb 515 + scratch_mb 9 + the driver's 64 MiB; 7 processes + the driver and the bwraps:
    # the sandbox's monitor, and as root the root stage's monitor and its PID namespace's init
    limits = SandboxLimits.from_config(CFG)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert (limits.cgroup_memory_bytes, limits.cgroup_pids) == ((515 + 9 + 64) << 20, 11)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert limits.cgroup_pids == 9


@pytest.mark.parametrize("timeout_s, expected", [(None, 2.5), (7.5, 7.5), (0.25, 0.25)])
def test_a_run_timeout_given_replaces_the_test_timeout(timeout_s, expected):
    limits = SandboxLimits.from_config(CFG, timeout_s=timeout_s)
    assert limits.timeout_s == expected
    assert limits.memory_mb == 515  # the rest is the config's


def test_the_output_cap_keeps_the_first_bytes_across_chunks():
    cap = _Capped(5)
    assert (bytes(cap.kept), cap.truncated) == (b"", False)
    cap.add(b"abc")
    assert (bytes(cap.kept), cap.truncated) == (b"abc", False)
    cap.add(b"de")  # exactly full: nothing dropped yet
    assert (bytes(cap.kept), cap.truncated) == (b"abcde", False)
    cap.add(b"")
    assert (bytes(cap.kept), cap.truncated) == (b"abcde", False)
    cap.add(b"f")
    assert (bytes(cap.kept), cap.truncated) == (b"abcde", True)
    cap.add(b"")  # once dropped, the output stays truncated
    assert (bytes(cap.kept), cap.truncated) == (b"abcde", True)
    assert cap.text() == "abcde"


def test_one_chunk_larger_than_the_cap_is_cut_at_the_cap():
    cap = _Capped(4)
    cap.add(b"abcdefgh")
    assert (bytes(cap.kept), cap.truncated) == (b"abcd", True)
    cap = _Capped(4)
    cap.add(b"ab")
    cap.add(b"cdef")  # two bytes of room, four offered
    assert (bytes(cap.kept), cap.truncated) == (b"abcd", True)


def test_one_byte_of_room_keeps_one_byte():
    cap = _Capped(5)
    cap.add(b"abcd")
    cap.add(b"ef")
    assert (bytes(cap.kept), cap.truncated) == (b"abcde", True)


def test_a_zero_cap_keeps_nothing():
    cap = _Capped(0)
    cap.add(b"")
    assert (bytes(cap.kept), cap.truncated) == (b"", False)
    cap.add(b"x")
    assert (bytes(cap.kept), cap.truncated) == (b"", True)
    assert cap.text() == ""


def test_a_character_cut_by_the_cap_becomes_a_replacement_character():
    cap = _Capped(4)
    cap.add("aé€".encode())  # 1 + 2 + 3 bytes: the cap ends inside the euro sign
    assert bytes(cap.kept) == b"a\xc3\xa9\xe2"
    assert cap.text() == "aé\ufffd"
    assert cap.truncated
