#!/usr/bin/env bash
# One device call on the lent H200: install the carried wheels, run the GPU tests, then the
# rollout benchmark. Everything it prints and writes lands in $OUT.
#
#   carry: .whl (xgrammar, apache-tvm-ffi, pydantic, pydantic-core, annotated-types,
#          typing-inspection for Python 3.12) and .gpu/tokenizer (scripts/bench_gpu_rollout.py
#          --build-tokenizer); both are git-ignored here.
#   run:   bash scripts/gpu_session.sh [smoke|rollout|all]
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TOKENIZERS_PARALLELISM=true
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.txt"
python3 -c "import torch, transformers, peft, xgrammar; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'xgrammar', xgrammar.__version__)"

if [[ $what == smoke || $what == all ]]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_engine.py tests/test_fast_engine.py 2>&1 | tee "$OUT/pytest_gpu.txt"
  timeout 180 python3 scripts/bench_gpu_rollout.py --shape 2layer --batch 64 --new 32 --lora 64 --repeats 1 \
    --variants hf_generate,static_free,static_grammar --out "$OUT/rollout_smoke.json" 2>&1 | grep -v Warning | tee "$OUT/rollout_smoke.log"
fi
if [[ $what == rollout || $what == all ]]; then
  timeout 420 python3 scripts/bench_gpu_rollout.py --shape 1.7b --batch 256 --new 128 --repeats 2 \
    --out "$OUT/rollout_1.7b.json" 2>&1 | grep -v Warning | tee "$OUT/rollout_1.7b.log"
fi
