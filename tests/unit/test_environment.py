"""The set-up's environment, as a training stage and a Snakemake start see it:
- every installed module they import has its bytecode. scripts/setup.sh and .ci/run install with
  --compile-bytecode because, where PYTHONDONTWRITEBYTECODE is set, a module without it is compiled
  from source again in every process (each Snakemake run, each job, each test's subprocess);
- on a machine without a GPU, torch is the CPU build, and triton (a GPU kernel compiler) is not
  installed, so `import torch` does not load it (scripts/cpu-overrides.txt)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# In a fresh interpreter: what `python -m snakemake --version` (which loads every installed
# executor plugin) and the training step import, as (module, source file) of the installed ones.
IMPORTED = """
import atexit, importlib.util, json, runpy, sys, sysconfig
roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
def report():
    out = []
    for name, module in list(sys.modules.items()):
        origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
        if origin.endswith(".py") and any(origin.startswith(r + "/") for r in roots):
            out.append((name, origin, importlib.util.cache_from_source(origin)))
    import torch
    print(json.dumps({"modules": out, "cuda": torch.version.cuda, "gpu": torch.cuda.is_available()}))
atexit.register(report)
import atlas.rl.step
sys.argv = ["snakemake", "--version"]
runpy.run_module("snakemake", run_name="__main__")
"""


def test_what_a_stage_and_snakemake_import_is_byte_compiled_and_gpu_free():
    proc = subprocess.run([sys.executable, "-c", IMPORTED], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    modules = seen["modules"]
    names = {name for name, _, _ in modules}
    assert {"torch", "transformers", "peft", "snakemake"} <= names  # the heavy ones are there
    missing = sorted(name for name, _, pyc in modules if not os.path.isfile(pyc))
    assert not missing, f"{len(missing)} of {len(modules)} modules have no bytecode, e.g. {missing[:10]}"
    if not seen["gpu"]:  # the set-up's default: the CPU build of torch, and no triton
        assert seen["cuda"] is None, f"torch is a CUDA {seen['cuda']} build on a machine without a GPU"
    if seen["cuda"] is None:
        assert "triton" not in names
