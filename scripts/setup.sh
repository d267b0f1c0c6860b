#!/usr/bin/env bash
# Set up atlas on a fresh machine: the sandbox for graded code (bubblewrap, a Debian/Ubuntu
# package), then a virtual environment .venv with the project and its test tools.
#
#   bash scripts/setup.sh           # .venv with atlas[test]
#   bash scripts/setup.sh verl      # also .venv-verl with atlas[test,verl] (verl pins transformers < 5.11)
#   ATLAS_EXTRAS=slurm bash scripts/setup.sh   # .venv with atlas[test,slurm]
#
# torch: the CPU build, torch==2.13.0+cpu, from a find-links folder that holds its wheel, else from
# PyTorch's CPU index (PyPI's Linux x86-64 torch is a CUDA build, several GB more), else, where that
# index is out of reach, PyPI's torch==2.13.0. On a GPU node install the torch build for your CUDA
# first and set ATLAS_TORCH= (empty) to keep it, or ATLAS_TORCH to another requirement. pip's
# find-links (PIP_FIND_LINKS, else pip's config) are passed on to uv, which reads neither. An
# offline node installs from a local wheelhouse instead: docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
torch=${ATLAS_TORCH-torch==2.13.0+cpu}
# pip's find-links, from its environment variable or else its config files (uv reads neither)
links=${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}
uv_args=() found= cpu_args=()
for dir in $links; do
  uv_args+=(--find-links "$dir")
  compgen -G "$dir/torch-${torch#torch==}-*.whl" >/dev/null && found=$dir
done
if [[ $torch == torch==*+cpu ]]; then
  cpu_args+=(--overrides scripts/cpu-overrides.txt)  # no triton: it only compiles GPU kernels
  if [[ -n $found ]]; then
    echo "setup: $torch from $found"
  else
    cpu_args+=(--torch-backend cpu)  # uv takes torch from https://download.pytorch.org/whl/cpu
    echo "setup: $torch from PyTorch's CPU index"
  fi
fi

# uv_install PYTHON ARGS...: uv's pip install into the environment of PYTHON, bytecode compiled
# ($compile: empty where the caller compiles it)
compile=--compile-bytecode
uv_install() { .venv/bin/python -m uv pip install $compile --python "$1" "${uv_args[@]}" "${@:2}"; }

# install_env PYTHON EXTRAS: the project with its extras and torch into the environment of PYTHON;
# where PyTorch's CPU index was asked and is out of reach, PyPI's build of the same version
install_env() {
  uv_install "$1" "${cpu_args[@]}" $torch -e ".[$2]" && return
  [[ $torch == torch==*+cpu && -z $found ]] || return 1
  echo "setup: PyTorch's CPU index is out of reach; ${torch%+cpu} from the package index instead" >&2
  uv_install "$1" "${torch%+cpu}" -e ".[$2]"
}

if ! command -v bwrap >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq bubblewrap
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq bubblewrap
  else
    echo "setup: bubblewrap (bwrap) is not installed and cannot be installed from here;" >&2
    echo "setup: graded code will run unsandboxed (sandboxed: false in every verdict)." >&2
    echo "setup: ask an administrator for the 'bubblewrap' package." >&2
  fi
fi

[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install -q uv
# --compile-bytecode: the .pyc files are written once here. Without them every process (each
# Snakemake job, each test's subprocess) compiles torch and transformers from source again when
# PYTHONDONTWRITEBYTECODE is set: about 7 s of CPU a process.
install_env .venv/bin/python test${ATLAS_EXTRAS:+,$ATLAS_EXTRAS}
# and atlas's own source, which the editable install leaves uncompiled (about 0.15 s of CPU a process that imports the trainer)
.venv/bin/python -m compileall -q -j 0 src > /dev/null

if [[ ${1:-} == verl ]]; then
  .venv/bin/python -m uv venv -q --allow-existing .venv-verl
  # The bytecode of what the two environments share (torch, numpy, ...: the same files) is
  # .venv's, linked; only the rest is compiled (scripts/reuse_bytecode.py).
  compile= install_env .venv-verl/bin/python test,verl
  .venv-verl/bin/python scripts/reuse_bytecode.py .venv
fi
echo "setup: done; activate with: . .venv/bin/activate"
