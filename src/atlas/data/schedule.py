"""The ordered training schedule: `steps` x `questions_per_step` slots drawn from the train set.

The pool (GPQA rows then LCB rows, each in file order) is read as a stream of epochs. With
`shuffle`, epoch e is the pool sorted by sha256(seed, e, uid): a pure function of its inputs, so
the order does not depend on any RNG implementation. A step never holds one question twice: at an
epoch boundary a repeat is held back to the next step, keeping the stream's order otherwise.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    slot: int  # global position, 0 .. steps * per_step - 1
    step: int
    position: int  # order within the step
    source: str
    question_uid: str


def epoch_order(
    pool: Sequence[tuple[str, str]], epoch: int, seed: int, shuffle: bool
) -> list[tuple[str, str]]:
    if not shuffle:
        return list(pool)

    def key(item: tuple[str, str]) -> str:
        return hashlib.sha256(f"atlas/schedule/v1:{seed}:{epoch}:{item[0]}".encode()).hexdigest()

    return sorted(pool, key=key)


def _stream(pool: Sequence[tuple[str, str]], seed: int, shuffle: bool) -> Iterator[tuple[str, str]]:
    epoch = 0
    while True:
        yield from epoch_order(pool, epoch, seed, shuffle)
        epoch += 1


def build_schedule(
    pool: Sequence[tuple[str, str]], steps: int, per_step: int, seed: int, shuffle: bool
) -> list[Slot]:
    """`pool` holds (question_uid, source) pairs in file order."""
    uids = [uid for uid, _ in pool]
    if len(set(uids)) != len(uids):
        raise ValueError("schedule pool holds duplicate question uids")
    if len(pool) < per_step:
        raise ValueError(
            f"schedule.questions_per_step is {per_step} but the training set holds only "
            f"{len(pool)} questions; a step needs that many distinct questions"
        )
    stream = _stream(pool, seed, shuffle)
    held: deque[tuple[str, str]] = deque()
    slots: list[Slot] = []
    for step in range(steps):
        chosen: list[tuple[str, str]] = []
        taken: set[str] = set()
        deferred: list[tuple[str, str]] = []
        while len(chosen) < per_step:
            item = held.popleft() if held else next(stream)
            if item[0] in taken:
                deferred.append(item)
                continue
            taken.add(item[0])
            chosen.append(item)
        held.extendleft(reversed(deferred))
        for position, (uid, source) in enumerate(chosen):
            slots.append(Slot(len(slots), step, position, source, uid))
    return slots
