#!/usr/bin/env bash
# Set up atlas on a fresh machine: the sandbox for graded code (bubblewrap, a Debian/Ubuntu
# package), then a virtual environment .venv with the project and its test tools.
#
#   bash scripts/setup.sh           # .venv with atlas[test]
#   bash scripts/setup.sh verl      # also .venv-verl with atlas[test,verl] (verl pins transformers < 5.11)
#
# torch: the CPU build, torch==2.13.0+cpu. PyTorch publishes it on its own index (PyPI's Linux
# x86-64 torch is a CUDA build, several GB more); a folder in PIP_FIND_LINKS that holds the wheel is
# used instead, with no index asked. On a GPU node install the torch build for your CUDA first and
# set ATLAS_TORCH= (empty) to keep it, or ATLAS_TORCH to another requirement. PIP_FIND_LINKS, if
# set, is passed on (uv does not read pip's config). An offline node installs from a local
# wheelhouse instead: docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
torch=${ATLAS_TORCH-torch==2.13.0+cpu}
uv_args=(${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"})
if [[ $torch == torch==*+cpu ]]; then
  uv_args+=(--overrides scripts/cpu-overrides.txt)  # no triton: it only compiles GPU kernels
  found=
  for dir in ${PIP_FIND_LINKS:-}; do
    compgen -G "$dir/torch-${torch#torch==}-*.whl" >/dev/null && found=$dir
  done
  if [[ -n $found ]]; then
    echo "setup: $torch from $found"
  else
    uv_args+=(--torch-backend cpu)  # uv takes torch from https://download.pytorch.org/whl/cpu
    echo "setup: $torch from PyTorch's CPU index"
  fi
fi

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
.venv/bin/python -m uv pip install --compile-bytecode --python .venv/bin/python "${uv_args[@]}" $torch -e '.[test]'

if [[ ${1:-} == verl ]]; then
  .venv/bin/python -m uv venv -q --allow-existing .venv-verl
  .venv/bin/python -m uv pip install --compile-bytecode --python .venv-verl/bin/python "${uv_args[@]}" $torch -e '.[test,verl]'
fi
echo "setup: done; activate with: . .venv/bin/activate"
