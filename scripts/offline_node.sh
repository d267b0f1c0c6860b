#!/usr/bin/env bash
# atlas on a GPU node without a package index (an offline cluster node): pack here, run there.
#
#   bash scripts/offline_node.sh pack DIR [LIST]
#       Here, in a clone set up by the README (its .venv does the downloading). DIR gets atlas (the
#       files git tracks, less resources/runs), DIR/wheels: the wheelhouse of LIST (default
#       scripts/wheels/h200-pipeline.txt, what a CUDA image holding torch, transformers and peft
#       lacks) for CPython $ATLAS_NODE_PYTHON (default 3.12) on manylinux x86-64, with its
#       SHA256SUMS, and DIR/debs: bubblewrap and the libraries it links, for a node without bwrap.
#       Copy DIR to the node.
#       For the verl engine, LIST is scripts/wheels/verl-vllm-h200.txt (verl, vLLM and the pipeline).
#   bash DIR/scripts/offline_node.sh run [drill] [pipeline] [bench] [tests]
#       There. Installs the wheelhouse into DIR/site (no index; the SHA256SUMS checked; once),
#       puts bwrap on PATH from DIR/debs where the node has none and checks the sandbox
#       (scripts/sandbox_check.py), then runs what is named (default: pipeline bench):
#         drill     scripts/drill.sh on one training run ($ATLAS_DRILL_RUN, default
#                   training_smoke): killed at its first checkpoint, so that `pipeline` after it
#                   resumes the run from there (resume_mode: auto); drill.txt says when and which
#                   checkpoints were left
#         pipeline  snakemake $ATLAS_TARGET --configfile $ATLAS_CONFIG --cores all
#                   --resources gpu_mem_gb=<GPU 0's GiB> --rerun-incomplete (ATLAS_TARGET: default
#                   results/report25/; ATLAS_CONFIG: one config or several laid over each other,
#                   space-separated; default config/h200.yaml), then `python -m atlas verify` of
#                   the report and the per-job time table
#         bench     scripts/bench_rollout.py, both modes (episodes in both schedules), over the
#                   pipeline's model
#         tests     the CUDA tests (tests/gpu)
#       $ATLAS_NODE_OUT (default DIR/out) gets the command, nvidia-smi, the sandbox check, Snakemake's log,
#       job_times.md, the report folder, each training run's step_metrics (and, under verl, verl's
#       metrics_<n>.jsonl, launch logs, overrides and episode counts in verl/<run>/),
#       bench_rollout.json and pytest_gpu.txt. python3 on PATH must be the interpreter that holds torch: the rules call
#       python and torchrun from PATH.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
what=${1:-}

pack() {
    local dir=${1:?pack DIR} list=${2:-$here/scripts/wheels/h200-pipeline.txt}
    local venv=$here/.venv/bin/python
    [[ -x $venv ]] || { echo "offline_node: no $venv: set the clone up first (README)" >&2; exit 1; }
    mkdir -p "$dir" && dir=$(cd "$dir" && pwd)
    [[ $dir != "$here" ]] || { echo "offline_node: DIR must not be the clone itself" >&2; exit 1; }
    # the code as git tracks it (working-tree contents), without the committed evidence
    git -C "$here" ls-files -z | grep -zv '^resources/runs/' | tar -C "$here" --null -T - -cf - | tar -C "$dir" -xf - || exit 1
    # atlas's own wheel, for its metadata: vLLM finds atlas's plugin by its entry point (the code
    # itself runs from DIR/src, first on PYTHONPATH)
    rm -f "$dir"/wheels/atlas-*.whl
    "$venv" -m pip wheel -q --no-deps -w "$dir/wheels" "$here" || exit 1
    PYTHON=$venv bash "$here/scripts/wheelhouse.sh" build "$list" "$dir/wheels" "${ATLAS_NODE_PYTHON:-3.12}" || exit 1
    rm -rf "$dir/debs" && mkdir -p "$dir/debs"
    if command -v apt-get > /dev/null; then
        (cd "$dir/debs" && apt-get download -q bubblewrap libcap2 libselinux1 libpcre2-8-0) ||
            echo "offline_node: apt-get download failed: the node needs its own bwrap" >&2
    else
        echo "offline_node: no apt-get here: the node needs its own bwrap" >&2
    fi
    echo "offline_node: packed $(du -sh "$dir" | cut -f1) into $dir; on the node: bash $(basename "$dir")/scripts/offline_node.sh run"
}

install() {
    local site=$here/site stamp
    stamp=$(sha256sum < "$here/wheels/SHA256SUMS" | cut -c1-16)
    if [[ $(cat "$site/.atlas-wheelhouse" 2> /dev/null) != "$stamp" ]]; then
        rm -rf "$site"
        bash "$here/scripts/wheelhouse.sh" install "$here/wheels" "$site" || exit 1
        python3 -m compileall -q -j 0 "$site" > /dev/null 2>&1
        echo "$stamp" > "$site/.atlas-wheelhouse"
    fi
    # DIR/src first: the code that runs is the tree's, whatever the wheelhouse's atlas holds
    export PYTHONPATH=$here/src:$site PYTHONUNBUFFERED=1
    # an image may forbid writing bytecode next to its packages: keep it here, so that only the
    # first of the pipeline's processes compiles what it imports
    unset PYTHONDONTWRITEBYTECODE
    export PYTHONPYCACHEPREFIX=$here/.pycache
    if ! command -v bwrap > /dev/null && compgen -G "$here/debs/*.deb" > /dev/null; then
        PATH=$(bash "$here/scripts/bwrap_from_deb.sh" "$here/debs" /var/tmp/atlas-bwrap):$PATH || exit 1
    fi
}

run() {
    [[ -f $here/wheels/SHA256SUMS ]] || { echo "offline_node: no $here/wheels: run this from a packed DIR" >&2; exit 1; }
    python3 -c "import torch" 2> /dev/null || { echo "offline_node: python3 on PATH has no torch" >&2; exit 1; }
    local steps=("$@") out=${ATLAS_NODE_OUT:-$here/out} config=${ATLAS_CONFIG:-config/h200.yaml}
    local configs
    read -ra configs <<< "$config"
    ((${#steps[@]})) || steps=(pipeline bench)
    mkdir -p "$out" && out=$(cd "$out" && pwd)
    install
    cd "$here" || exit 1
    echo "bash scripts/offline_node.sh run ${steps[*]}  (ATLAS_CONFIG=$config)" > "$out/command.txt"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/nvidia_smi.txt"
    python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" | tee -a "$out/command.txt"
    python3 scripts/sandbox_check.py --out "$out/sandbox_check.json" > /dev/null 2>&1 ||
        { echo "offline_node: the sandbox check failed (scripts/sandbox_check.py)" >&2; exit 1; }
    local step
    for step in "${steps[@]}"; do
        case $step in
        drill) drill "$out" "${configs[@]}" ;;
        pipeline) pipeline "$out" "${configs[@]}" ;;
        bench) bench "$out" "${configs[-1]}" ;;
        tests) python3 -m pytest -p no:cacheprovider -o addopts="" -q -ra tests/gpu > "$out/pytest_gpu.txt" 2>&1
            echo "tests/gpu: exit $?; $(tail -1 "$out/pytest_gpu.txt")" ;;
        *) echo "offline_node: run takes drill, pipeline, bench or tests, not $step" >&2; exit 2 ;;
        esac
    done
}

gpu_gib() {  # the jobs share GPU 0: each claims its resources.gpu_memory_gb from GPU 0's memory
    echo $(($(nvidia-smi --id=0 --query-gpu=memory.total --format=csv,noheader,nounits) / 1024))
}

drill() {
    local out=$1 run=${ATLAS_DRILL_RUN:-training_smoke} gib
    shift
    gib=$(gpu_gib)
    echo "bash scripts/drill.sh $run --configfile $* --cores all --resources gpu_mem_gb=$gib" >> "$out/command.txt"
    PYTHON=python3 bash "$here/scripts/drill.sh" "$run" --configfile "$@" --cores all --resources gpu_mem_gb="$gib" \
        > "$out/drill_snakemake.log" 2>&1
    local rc=$?
    grep '^drill:' "$out/drill_snakemake.log" | tee "$out/drill.txt"
    return $rc
}

pipeline() {
    local out=$1 gib start rc log target=${ATLAS_TARGET:-results/report25/}
    shift
    gib=$(gpu_gib)
    echo "python3 -m snakemake $target --configfile $* --cores all --resources gpu_mem_gb=$gib --keep-going --rerun-incomplete" >> "$out/command.txt"
    python3 -m snakemake --configfile "$@" --unlock > /dev/null 2>&1  # a run cut short leaves its lock
    start=$(date +%s)
    python3 -m snakemake "$target" --configfile "$@" --cores all --resources gpu_mem_gb="$gib" --keep-going --rerun-incomplete
    rc=$?
    echo "snakemake: exit $rc after $(($(date +%s) - start)) s"
    log=$(ls -t .snakemake/log/*.snakemake.log 2> /dev/null | head -1)
    if [[ -n $log ]]; then
        cp "$log" "$out/snakemake.log"
        python3 scripts/job_times.py "$log" --json "$out/job_times.json" | tee "$out/job_times.md"
    fi
    mkdir -p "$out/step_metrics"
    for f in results/runs/*/step_metrics.parquet; do
        [[ -f $f ]] && cp "$f" "$out/step_metrics/$(basename "$(dirname "$f")").parquet"
    done
    local verl run
    for verl in results/checkpoints/*/verl; do  # verl's own outputs, beside the converted run
        [[ -d $verl ]] || continue
        run=$(basename "$(dirname "$verl")")
        mkdir -p "$out/verl/$run"
        cp "$verl"/metrics_*.jsonl "$verl"/launch_*.log "$verl"/overrides.txt "$verl"/episode_counts.json "$out/verl/$run/" 2> /dev/null
    done
    tar -czf "$out/logs.tgz" results/logs 2> /dev/null
    if [[ -d results/report25 ]]; then
        rm -rf "$out/report25" && cp -r results/report25 "$out/report25"
        python3 -m atlas verify results/report25 2>&1 | tee "$out/verify.txt"
    fi
    return "$rc"
}

bench() {
    local out=$1 config=$2
    python3 scripts/bench_rollout.py --config "$config" --modes generation,episode --schedules continuous,rounds \
        --out "$out/bench_rollout.json" > "$out/bench_rollout.log" 2>&1
    echo "bench_rollout: exit $?"
    grep -E "tok/s|/ generation" "$out/bench_rollout.log"
}

case $what in
pack) shift && pack "$@" ;;
run) shift && run "$@" ;;
*) sed -n '2,/^set -uo/p' "$0" | grep '^#' >&2 && exit 2 ;;
esac
