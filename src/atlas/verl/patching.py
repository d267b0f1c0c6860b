"""What atlas.verl.actor and atlas.verl.critic do on import before they change verl: check the
version and the source of every verl function they override, wrap or rely on, then put their
engine class in verl's EngineRegistry in place of verl's own.

    check_verl("atlas.verl.critic", "0.9.1", {"FSDPEngine.initialize": "<sha256>"}, owners, Error, hint)
    replace_engine("value_model", CriticEngine, FSDPEngineWithValueHead, Error, "atlas.verl.critic")
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os

import verl
from verl.workers.engine.base import EngineRegistry

logger = logging.getLogger(__name__)


def source_hash(fn) -> str:
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()


def check_verl(
    module: str, version: str, expected: dict[str, str], owners: dict, error: type[Exception], recheck: str
) -> None:
    """Raise `error` unless verl is `version` and each "Owner.name" in `expected` (Owner a key of
    `owners`: a class or a module) has the source of that sha256. `recheck` says what to read again
    in another verl."""
    if verl.__version__ != version:
        raise error(
            f"{module} was written against verl {version}; verl {verl.__version__} is installed "
            f"({os.path.dirname(verl.__file__)}). {recheck}"
        )
    for qualname, digest_expected in expected.items():
        owner, name = qualname.rsplit(".", 1)
        fn = inspect.getattr_static(owners[owner], name)
        fn = getattr(fn, "__func__", fn)  # a staticmethod
        digest = source_hash(fn)
        if digest != digest_expected:
            where = f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
            raise error(
                f"verl's {qualname} ({where}) is not the source {module} was written against "
                f"(sha256 {digest[:12]}, expected {digest_expected[:12]}); read it and re-check the "
                "override before updating the hash"
            )


def replace_engine(model_type: str, ours: type, theirs: type, error: type[Exception], module: str) -> None:
    """verl's EngineRegistry builds `ours` wherever it mapped `model_type` (fsdp and fsdp2) to
    `theirs`; any other class there, or no entry, raises `error`."""
    by_backend = EngineRegistry._engines.get(model_type, {})
    replaced = []
    for backend in ("fsdp", "fsdp2"):
        entries = by_backend.get(backend, {})
        if not entries:
            raise error(f"verl's EngineRegistry has no {model_type} engine for backend {backend!r}")
        for key, cls in entries.items():
            if cls is ours:
                continue
            if cls is not theirs:
                raise error(
                    f"verl's EngineRegistry maps ({model_type}, {backend}, {key}) to {cls.__qualname__}; "
                    f"expected verl's {theirs.__qualname__}"
                )
            entries[key] = ours
            replaced.append((backend, key))
    logger.info("%s: %s registered for %s %s", module, ours.__qualname__, model_type, replaced)
