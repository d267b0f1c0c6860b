"""The set-up's environment (scripts/setup.sh, and the test-only SLURM executor plugin that .ci/run
installs beside it, in the folder ATLAS_SLURM_PLUGIN names):
- every installed module has its bytecode. The set-up installs with --compile-bytecode because,
  where PYTHONDONTWRITEBYTECODE is set, a module without it is compiled from source again in every
  process that imports it (each Snakemake run imports the executor plugins and pandas, each job
  torch, transformers and peft);
- on a machine without a GPU, torch is the CPU build, and with the CPU build triton (a GPU kernel
  compiler) is not installed, so torch._dynamo, which transformers imports, does not load it
  (scripts/cpu-overrides.txt)."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import shutil
import sysconfig
from pathlib import Path


def _compiles(path: str) -> bool:
    """Whether this interpreter can compile the file (a few ship syntax of a newer Python)."""
    try:
        compile(Path(path).read_bytes(), path, "exec", dont_inherit=True)
    except SyntaxError:
        return False
    return True


def test_every_installed_module_has_its_bytecode():
    beside = [os.environ["ATLAS_SLURM_PLUGIN"]] if os.environ.get("ATLAS_SLURM_PLUGIN") else []
    roots = tuple({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *beside})
    dists = [
        *importlib.metadata.distributions(),
        *(importlib.metadata.distributions(path=beside) if beside else ()),
    ]
    sources, missing = 0, []
    for dist in dists:
        for file in dist.files or []:
            if file.suffix != ".py":
                continue
            path = str(file.locate())
            if not path.startswith(roots):
                continue
            sources += 1
            if not os.path.isfile(importlib.util.cache_from_source(path)) and _compiles(path):
                missing.append(f"{dist.metadata['Name']}: {file}")
    assert sources > 10_000  # torch, transformers, peft, snakemake, ... were all seen
    assert not missing, f"{len(missing)} of {sources} modules have no bytecode, e.g. {missing[:10]}"


def test_a_machine_without_a_gpu_has_the_cpu_build_of_torch_and_no_triton():
    gpu = bool(glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd") or shutil.which("nvidia-smi"))
    build = importlib.metadata.version("torch").partition("+")[2]
    if not gpu:
        assert build == "cpu", f"torch {importlib.metadata.version('torch')} on a machine without a GPU"
    if build == "cpu":
        assert importlib.util.find_spec("triton") is None
