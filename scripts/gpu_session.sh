#!/usr/bin/env bash
# atlas on an H200 machine with no package registry: the one place that knows how that machine is
# reached. Two halves:
#
#   bash scripts/gpu_session.sh pack DIR     here: DIR gets the code (src, scripts, tests,
#                                            config, fixtures), the wheels the image lacks
#                                            (xgrammar, pydantic, liger-kernel) and the synthetic
#                                            151,936-token tokenizer, under the 64 MiB one call
#                                            carries
#   cd DIR && bash scripts/gpu_session.sh bench   there: install the wheels, then the GPU tests,
#                                            the 8B update benchmark and the 1.7B rollout
#                                            benchmark; everything printed and written lands in $OUT
#
# The device tool sends /work/main's tree: DIR is /work/main/.dev/gpu (git-ignored there), named
# in the call's carry, and the call's command is
#   cd .dev/gpu && OUT=$OUT bash scripts/gpu_session.sh bench 2>&1 | tee $OUT/log
# The figures in docs/performance.md came from that call.
set -uo pipefail
what=${1:-bench}
here=$(cd "$(dirname "$0")/.." && pwd)

if [[ $what == pack ]]; then
  dir=${2:?pack DIR}
  mkdir -p "$dir/whl"
  rm -rf "$dir/src" "$dir/scripts" "$dir/tests" "$dir/config" "$dir/resources"
  cp -r "$here/src" "$here/scripts" "$here/tests" "$here/config" "$dir/"
  mkdir -p "$dir/resources" && cp -r "$here/resources/fixtures" "$dir/resources/"
  find "$dir" -name __pycache__ -prune -exec rm -rf {} + ; rm -rf "$dir"/src/*.egg-info
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$dir/whl" \
    xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 pydantic==2.14.4 pydantic-core==2.50.5 \
    annotated-types typing-inspection liger-kernel==0.8.5
  [[ -f $dir/tokenizer/tokenizer.json ]] || PYTHONPATH=$here/src python3 -c \
    "import sys; from atlas.model.shapes import synthetic_tokenizer; synthetic_tokenizer().save_pretrained(sys.argv[1])" \
    "$dir/tokenizer"
  du -sh "$dir"
  exit 0
fi

OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
quiet() { grep -v -i "warn\|softmax\|inductor\|important use\|^$"; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.txt"
python3 -c "import torch, transformers, peft, xgrammar, liger_kernel; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"

if [[ $what == bench ]]; then
  # resources/perf/h200_update_8b.json: the trainer's PPO update at the 8B shape
  timeout 200 python3 scripts/bench_update.py --shape 8b --out "$OUT/update_8b.json" 2>&1 | quiet | tee "$OUT/update_8b.log"
  # resources/perf/h200_rollout_1.7b.json: the report's 32 x 8 batch, no LoRA against merged LoRA r64
  timeout 330 python3 scripts/bench_rollout.py --shape 1.7b --tokenizer tokenizer --arms base,merged \
    --out "$OUT/rollout_1.7b.json" 2>&1 | quiet | tee "$OUT/rollout_1.7b.log"
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_packing.py 2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"
fi
