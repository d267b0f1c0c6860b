#!/usr/bin/env bash
# One device call on an H200: install the carried wheels, run the GPU tests, then the
# rollout benchmark. Everything it prints and writes lands in $OUT.
#
#   carry: .whl and .gpu/tokenizer, both git-ignored (.git/info/exclude). Make them once:
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#       xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 pydantic==2.14.4 pydantic-core==2.50.5 \
#       annotated-types typing-inspection
#     PYTHONPATH=src python scripts/bench_gpu_rollout.py --build-tokenizer --tokenizer .gpu/tokenizer
#     and for `update` and `perf` also the liger-kernel wheel (pure Python; triton is on the device):
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl liger-kernel==0.8.5
#   run:   bash scripts/gpu_session.sh smoke, then bash scripts/gpu_session.sh rollout (one device
#          call each: together they can pass the 10-minute limit of one call); likewise `update`
#          (the LoRA update benchmark, 8B and 1.7B) and `perf` (the report's perf tests, 1.7B)
#   train: WHEELS=.whl-train bash scripts/gpu_session.sh train, with .whl-train holding .whl's
#          wheels but liger plus polars and polars-runtime-32 (the journal writes with polars;
#          54 MB, so the 64 MiB carry leaves out .gpu/tokenizer): carry .whl-train,
#          .gpu/train_gpu_slice.json, results/models/tiny and results/data
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ${WHEELS:-.whl}/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TOKENIZERS_PARALLELISM=true
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.txt"
python3 -c "import torch, transformers, peft, xgrammar; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'xgrammar', xgrammar.__version__)"

if [[ $what == smoke || $what == all ]]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_engine.py tests/test_fast_engine.py 2>&1 | tee "$OUT/pytest_gpu.txt"
  timeout 180 python3 scripts/bench_gpu_rollout.py --shape 2layer --batch 64 --new 32 --lora 64 --repeats 1 \
    --variants hf_generate,static_free,static_grammar --out "$OUT/rollout_smoke.json" 2>&1 | grep -v Warning | tee "$OUT/rollout_smoke.log"
fi
if [[ $what == rollout || $what == all ]]; then
  # resources/perf/h200_rollout_1.7b.json (32 questions x 8 samples), h200_rollout_kernels_1.7b.txt
  # and h200_rollout_1.7b_unique_prompts.json came from these lines
  timeout 330 python3 scripts/bench_gpu_rollout.py --shape 1.7b --batch 256 --samples 8 --new 128 --repeats 2 \
    --lora 0 --variants hf_generate,static_free,static_grammar,static_grammar_full,agreement --profile "$OUT" \
    --out "$OUT/rollout_1.7b.json" 2>&1 | grep -v -i "warn\|softmax\|inductor\|important use\|^$" | tee "$OUT/rollout_1.7b.log"
  timeout 200 python3 scripts/bench_gpu_rollout.py --shape 1.7b --batch 256 --samples 1 --new 128 --repeats 2 \
    --lora 0 --variants static_free,static_grammar,static_grammar_full \
    --out "$OUT/rollout_1.7b_unique_prompts.json" 2>&1 | grep -v -i "warn\|softmax\|inductor\|important use\|^$" | tee "$OUT/rollout_1.7b_unique.log"
  [[ $what == all ]] && timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_engine.py 2>&1 | tee "$OUT/pytest_gpu_engine.txt"
fi
if [[ $what == lora ]]; then
  # resources/perf/h200_rollout_1.7b_lora64.json and h200_rollout_kernels_1.7b_lora64.txt came from
  # these lines: the actor's LoRA r64 through the engine's fused LoRA forward (h200_rollout_1.7b_lora64_peft.json: through peft's, before)
  timeout 460 python3 scripts/bench_gpu_rollout.py --shape 1.7b --batch 256 --samples 8 --new 128 --repeats 2 \
    --lora 64 --variants static_free,static_grammar,static_grammar_full --profile "$OUT" \
    --out "$OUT/rollout_1.7b_lora64.json" 2>&1 | grep -v -i "warn\|softmax\|inductor\|important use\|^$" | tee "$OUT/rollout_1.7b_lora64.log"
fi
if [[ $what == train ]]; then
  # The local engine's training loop on CUDA (StaticEngine rollouts, compiled), 2 steps of the tiny
  # model (carry results/models/tiny, results/data and .gpu/train_gpu_slice.json: the
  # training_smoke slice with resources cuda/1 and wandb disabled), then the GPU tests.
  timeout 300 python3 -m atlas.stages.train --config-slice "$(cat .gpu/train_gpu_slice.json)" \
    --train results/data/train.parquet --val results/data/val.parquet --tests results/data/tests.parquet \
    --model results/models/tiny --checkpoints "$OUT/checkpoints" --out "$OUT/run" 2>&1 \
    | grep -v -i "warn\|softmax\|inductor\|important use\|^$" | tail -60 | tee "$OUT/train_gpu.log"
  python3 -c "import json, sys, pyarrow.parquet as pq; rows = pq.read_table(sys.argv[1]).to_pylist(); \
json.dump(rows, open(sys.argv[2], 'w'), indent=1, default=str); \
[print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k.startswith(('step', 'timing_s/', 'perf/', 'reward', 'rollout/'))}) for r in rows]" \
    "$OUT/run/step_metrics.parquet" "$OUT/train_gpu_metrics.json" | tee -a "$OUT/train_gpu.log"
  rm -rf "$OUT/checkpoints" "$OUT/run"
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_engine.py tests/test_gpu_packing.py 2>&1 | tail -3 | tee "$OUT/pytest_gpu.txt"
fi
if [[ $what == dp ]]; then
  # nvidia-h200-x2 (carry also results/models/tiny, results/runs/training_smoke,
  # results/checkpoints/training_smoke and .gpu/training_smoke_slice.json, the run's training slice):
  # the NCCL distributed roundtrip, then the data-parallel step on 2 and on 1 GPU.
  # resources/perf/h200x2_dp_1.7b.json came from these lines and
  #   python scripts/dp_scaling.py OUT/dp_1.json OUT/dp_2.json --roundtrip OUT/roundtrip --out resources/perf/h200x2_dp_1.7b.json
  export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=4 PYTHONPATH=$PYTHONPATH:$PWD/scripts
  timeout 100 torchrun --standalone --nproc-per-node 2 -m atlas.stages.distributed_roundtrip --model results/models/tiny \
    --run-folder results/runs/training_smoke --training "$(cat .gpu/training_smoke_slice.json)" --seed 0 \
    --out "$OUT/roundtrip" 2>&1 | grep -v -i warn | tail -8 | tee "$OUT/roundtrip.log"
  for n in 2 1; do
    timeout 140 torchrun --standalone --nproc-per-node $n scripts/bench_gpu_dp.py --shape 1.7b --rows 16 \
      --row-tokens 2048 --steps 2 --out "$OUT/dp_$n.json" 2>&1 | grep -v -i warn | tail -16 | tee "$OUT/dp_$n.log"
  done
fi
if [[ $what == update ]]; then
  # resources/perf/h200_update_8b.json and h200_update_1.7b.json came from these lines
  timeout 300 python3 scripts/bench_gpu_update.py --shape 8b --profile "$OUT" --out "$OUT/update_8b.json" 2>&1 \
    | grep -v Warning | tee "$OUT/update_8b.log"
  timeout 200 python3 scripts/bench_gpu_update.py --shape 1.7b --rows 8 --profile "$OUT" --out "$OUT/update_1.7b.json" 2>&1 \
    | grep -v Warning | tee "$OUT/update_1.7b.log"
fi
if [[ $what == perf ]]; then
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_packing.py 2>&1 | tee "$OUT/pytest_gpu_packing.txt"
  # resources/perf/h200_perf_1.7b.json came from this line
  timeout 480 python3 scripts/bench_gpu_perf.py --shape 1.7b --out "$OUT/perf_1.7b.json" 2>&1 \
    | grep -v Warning | tee "$OUT/perf_1.7b.log"
fi
