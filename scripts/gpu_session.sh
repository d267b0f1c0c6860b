#!/usr/bin/env bash
# atlas on a GPU node with no package registry (an offline cluster node): the code and the wheels
# it lacks are packed here and copied there in folders of at most 60 MiB. Two halves:
#
#   bash scripts/gpu_session.sh pack DIR     here: DIR gets the code (src, scripts, tests,
#                                            config, fixtures) and the wheels the image lacks
#                                            (xgrammar, pydantic, liger-kernel); the rollout
#                                            benchmark builds the synthetic tokenizer there
#   cd DIR && bash scripts/gpu_session.sh bench   there: install the wheels, then the GPU tests,
#                                            the 8B update benchmark and the 1.7B rollout
#                                            benchmark; everything printed and written lands in $OUT
#   bash scripts/gpu_session.sh pack-pipeline DIR   here: DIR gets the pipeline (Snakefile, rules,
#                                            profiles, config, src, fixtures, tests) and the
#                                            wheelhouse of scripts/wheels/h200-pipeline.txt, split
#                                            into DIR/whl/part-N folders of at most 60 MiB
#   cd DIR && bash scripts/gpu_session.sh stage   there: keep the wheel parts copied so far in
#                                            /tmp/atlas-pipeline/wheels, when the parts arrive one
#                                            at a time
#   cd DIR && bash scripts/gpu_session.sh pipeline   there: install the wheelhouse offline, run
#                                            snakemake --cores all on ATLAS_BASE_CONFIG (default
#                                            config/h200.yaml; config/h200-tiny.yaml is the tiny
#                                            embedded default on CUDA) plus any ATLAS_CONFIGS to
#                                            results/report25/, and put the report folder, the job
#                                            logs and snakemake's log in $OUT. ATLAS_GPU_TESTS=1
#                                            also runs tests/gpu (beside the pipeline, under
#                                            ATLAS_GPU_TESTS_S, default 300 s) into
#                                            $OUT/pytest_gpu.txt. ATLAS_KILL_CHECK=1 then
#                                            reruns the validation jobs, kills Snakemake (-9)
#                                            once one holds the GPU, counts the stage processes
#                                            left and reruns: $OUT/kill_check.txt
#
# OUT defaults to /tmp/out. docs/gpu.md and docs/performance.md have the figures these commands
# print on an H200.
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
  du -sh "$dir"
  exit 0
fi

if [[ $what == pack-pipeline ]]; then
  dir=${2:?pack-pipeline DIR}
  mkdir -p "$dir/whl/all"
  rm -rf "$dir/code" && mkdir -p "$dir/code/resources"
  cp -r "$here/Snakefile" "$here/rules" "$here/profiles" "$here/envs" "$here/config" "$here/src" \
    "$here/pyproject.toml" "$here/report" "$here/tests" "$dir/code/"
  mkdir -p "$dir/code/scripts" && cp "$here/scripts/sandbox_check.py" "$dir/code/scripts/"
  cp -r "$here/resources/fixtures" "$dir/code/resources/"
  mkdir -p "$dir/scripts" && cp "$here/scripts/gpu_session.sh" "$here/scripts/bwrap_from_deb.sh" "$dir/scripts/"
  # the grader's sandbox: bubblewrap and the libraries it links, unpacked there without apt
  rm -rf "$dir/debs" && mkdir -p "$dir/debs"
  (cd "$dir/debs" && apt-get download -q bubblewrap libcap2 libselinux1 libpcre2-8-0) || exit 1
  find "$dir/code" -name __pycache__ -prune -exec rm -rf {} + ; rm -rf "$dir"/code/src/*.egg-info
  wheels=$(grep -v '^#' "$here/scripts/wheels/h200-pipeline.txt")
  binary=$(grep -v '^connection-pool' <<<"$wheels")
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir/whl/all" $binary || exit 1
  # published as an sdist only: a pure-Python package, so a py3-none-any wheel built here runs there
  python3 -m pip wheel -q --no-deps -w "$dir/whl/all" $(grep '^connection-pool' <<<"$wheels") || exit 1
  # each call carries at most 64 MiB: largest wheels first, into parts of at most 60 MiB
  rm -rf "$dir"/whl/part-*
  part=1 size=0
  for f in $(ls -S "$dir/whl/all"); do
    n=$(stat -c %s "$dir/whl/all/$f")
    if (( size + n > 60 * 1024 * 1024 && size > 0 )); then part=$((part + 1)) size=0; fi
    mkdir -p "$dir/whl/part-$part" && ln "$dir/whl/all/$f" "$dir/whl/part-$part/$f" && size=$((size + n))
  done
  du -sh "$dir"/whl/part-* "$dir/code"
  exit 0
fi

OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# the pipeline's wheelhouse and install target, apart from any other environment on the node
wheels=/tmp/atlas-pipeline/wheels site=/tmp/atlas-pipeline/site

if [[ $what == stage ]]; then
  mkdir -p "$wheels" && cp whl/part-*/*.whl "$wheels/" && ls "$wheels" | wc -l
  exit 0
fi

if [[ $what == pipeline ]]; then
  mkdir -p "$wheels" && cp whl/part-*/*.whl "$wheels/" 2>/dev/null
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$wheels"/*.whl || exit 1
  # the rules call `python` and `torchrun` from PATH: the image's venv has both
  export PYTHONPATH=$site:$PWD/code/src PYTHONUNBUFFERED=1
  if ! command -v bwrap > /dev/null && [[ -d debs ]]; then
    PATH=$(bash scripts/bwrap_from_deb.sh debs /var/tmp/atlas-bwrap):$PATH
  fi
  # the graders' verdicts on fixed programs, to compare with another machine's
  python3 code/scripts/sandbox_check.py --out "$OUT/sandbox_check.json" > /dev/null 2>&1
  python3 -c "import json, sys; d = json.load(open(sys.argv[1]))['machine']; print('sandbox:', d)" \
    "$OUT/sandbox_check.json"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia_smi.txt"
  cd code || exit 1
  configs="${ATLAS_BASE_CONFIG:-config/h200.yaml} ${ATLAS_CONFIGS:-}"
  echo "configs: $configs"
  tests=
  if [[ ${ATLAS_GPU_TESTS:-0} == 1 ]]; then
    # the CUDA tests, in one process beside the pipeline (pyproject's addopts ask for xdist workers)
    timeout "${ATLAS_GPU_TESTS_S:-300}" python3 -m pytest -p no:cacheprovider -o addopts="" -ra -v \
      tests/gpu > "$OUT/pytest_gpu.txt" 2>&1 &
    tests=$!
  fi
  # a run cut short (a timeout, a kill) leaves Snakemake's lock behind: the next call would refuse
  python3 -m snakemake --configfile $configs --unlock > /dev/null 2>&1
  start=$(date +%s)
  # --configfile takes several files: the options after it end the list before the target
  # one GPU job at a time by default (ATLAS_GPU_JOBS raises it): each holds a model and its caches;
  # a call after one cut short by the timeout resumes, redoing the jobs it left incomplete
  timeout "${ATLAS_PIPELINE_S:-540}" python3 -m snakemake --configfile $configs --cores all \
    --resources gpu="${ATLAS_GPU_JOBS:-1}" --keep-going --rerun-incomplete results/report25/
  echo "snakemake rc=$? after $(( $(date +%s) - start )) s"
  if [[ -n $tests ]]; then
    wait "$tests"; echo "pytest tests/gpu rc=$?"; tail -25 "$OUT/pytest_gpu.txt"
  fi
  last=$(ls -t .snakemake/log/*.snakemake.log 2>/dev/null | head -1)
  [[ -n $last ]] && cp "$last" "$OUT/snakemake.log"
  if [[ ${ATLAS_KILL_CHECK:-0} == 1 ]]; then
    # kill -9 of Snakemake while its validation jobs hold the GPU: no stage may run on (each dies
    # with its starter, atlas.lifetime), and the same command again finishes the run
    stages() { for d in /proc/[0-9]*; do
      tr '\0' ' ' 2>/dev/null < "$d/cmdline" | grep -q -- "-m atlas.stages\.${1:-}" && echo "${d#/proc/}"
    done; }
    python3 -m snakemake --configfile $configs --cores all --resources gpu="${ATLAS_GPU_JOBS:-1}" \
      --forcerun validation results/report25/ > "$OUT/kill_check_run.log" 2>&1 &
    smk=$! held=
    for _ in $(seq 600); do
      for pid in $(stages validation); do
        ls -l "/proc/$pid/fd" 2>/dev/null | grep -q /dev/nvidia && held=$pid && break 2
      done
      sleep 0.2
    done
    {
      echo "validation job on the GPU: pid ${held:-none}: $(tr '\0' ' ' 2>/dev/null < "/proc/$held/cmdline" | cut -c1-90)"
      echo "its GPU files: $(ls -l "/proc/$held/fd" 2>/dev/null | grep -o '/dev/nvidia[^ ]*' | sort -u | tr '\n' ' ')"
      echo "stage processes before the kill: $(stages | wc -l)"
      kill -9 "$smk"; killed=$(date +%s%3N)
      for _ in $(seq 100); do [[ -z $(stages) ]] && break; sleep 0.1; done
      echo "stage processes $(( $(date +%s%3N) - killed )) ms after kill -9 of snakemake: $(stages | wc -l)"
      for pid in $(stages); do tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | cut -c1-120; echo; done
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv
      python3 -m snakemake --configfile $configs --unlock > /dev/null 2>&1
      start=$(date +%s)
      # every target (rule all): the killed jobs' outputs are gone, and results/report25/, whose
      # inputs they were, is still up to date without them, so Snakemake would not rerun them for it
      timeout 300 python3 -m snakemake --configfile $configs --cores all --resources gpu="${ATLAS_GPU_JOBS:-1}" \
        --rerun-incomplete > "$OUT/kill_check_rerun.log" 2>&1
      echo "snakemake again: rc=$? after $(( $(date +%s) - start )) s; its jobs:"
      sed -n '/^Job stats/,/^$/p' "$OUT/kill_check_rerun.log" | grep -E '^[a-z_]+ +[0-9]+$'
      ls -d results/validation/*
    } 2>&1 | tee "$OUT/kill_check.txt"
  fi
  tar -czf "$OUT/logs.tgz" results/logs 2>/dev/null
  [[ -d results/report25 ]] && tar -czf "$OUT/report25.tgz" -C results report25
  ls -la "$OUT"
  exit 0
fi

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
quiet() { grep -v -i "warn\|softmax\|inductor\|important use\|^$"; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.txt"
python3 -c "import torch, transformers, peft, xgrammar, liger_kernel; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"

if [[ $what == bench ]]; then
  # resources/perf/h200_update_8b.json: the trainer's PPO update at the 8B shape
  timeout 200 python3 scripts/bench_update.py --shape 8b --out "$OUT/update_8b.json" 2>&1 | quiet | tee "$OUT/update_8b.log"
  # the report's 32 x 8 batch, no LoRA against merged LoRA r64 (docs/gpu.md)
  timeout 330 python3 scripts/bench_rollout.py --config config/h200.yaml --tokenizer tokenizer --modes generation \
    --out "$OUT/rollout_1.7b.json" 2>&1 | quiet | tee "$OUT/rollout_1.7b.log"
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_packing.py 2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"
fi
