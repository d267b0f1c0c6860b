#!/usr/bin/env bash
# The verl engine on one GPU node without a package index, the stage launched by hand: a run of
# atlas.verl.launch with vLLM rollouts, killed after its first step and launched again
# (resume_mode=auto), then converted. It made the evidence in resources/runs/h200-verl/; a user's
# node runs the same through the workflow with scripts/offline_node.sh (docs/verl.md).
#
# Where files arrive a few tens of MiB at a time, the wheelhouse (scripts/wheelhouse.sh build
# scripts/wheels/verl-vllm-h200.txt DIR; split DIR PARTS) comes in parts:
#   bash tools/verl_h200.sh part PARTS_DIR              keep the parts that arrived (in /tmp/parts)
#   bash tools/verl_h200.sh run BUNDLE OUT              join + install the wheelhouse, then the run
#   bash tools/verl_h200.sh resume BUNDLE OUT           the second launch alone (a run cut short)
#   KILL_AT_STEP=N bash tools/verl_h200.sh run ...      kill the first launch once verl has saved
#                                                       global step N (default 1); 0: no kill, one
#                                                       launch from scratch to the end
#   bash tools/verl_h200.sh slices BUNDLE [CONFIG]      here: the bundle's stage slices, from
#                                                       config/config.yaml under CONFIG
#                                                       (default config/verl-node.yaml)
# BUNDLE holds: atlas-*.whl (the project, for its vllm.general_plugins entry point), slice.json,
# checks.json and roundtrip.json (the config slices of training_smoke's train, checks and
# distributed_roundtrip jobs, engine verl: `slices` writes them), model/ and data/ (results/models/<m>,
# results/data), this folder's scripts, and debs/ (bubblewrap for the graders' sandbox, unpacked
# by bwrap_from_deb.sh where the node has no bwrap). OUT receives the logs, the episode counts and a tar of
# the run folder and the verl checkpoints' index. After a launch that ends the run, the checks
# stage runs on it there (distributed_roundtrip, then checks), as the workflow's checks rule would.
set -uo pipefail
set -m  # every background launch in its own process group, killed as a group
what=$1
parts=/tmp/parts

if [[ $what == part ]]; then
    mkdir -p "$parts"
    mv "$2"/wheelhouse.tar.* "$2"/SHA256SUMS "$parts"/ 2>/dev/null
    ls -la "$parts"
    exit 0
fi

if [[ $what == slices ]]; then
    here=$(cd "$(dirname "$0")/.." && pwd)
    dir=${2:?slices BUNDLE} overlay=${3:-$here/config/verl-node.yaml}
    mkdir -p "$dir"
    PYTHONPATH=$here/src python3 - "$here/config/config.yaml" "$overlay" "$dir" <<'EOF'
import json, sys
from pathlib import Path

from atlas.config.study import config_slice, merged, parse_config, read_yaml
from atlas.hashing import canonical_json

base, overlay, dest = sys.argv[1:]
config = parse_config(merged(read_yaml(base), read_yaml(overlay)), overlay)
slices = {
    "slice.json": config_slice(config, "training", "training_smoke"),
    "checks.json": config_slice(config, "checks", "training_smoke"),
    "roundtrip.json": config_slice(config, "distributed_roundtrip"),
}
for name, value in slices.items():
    Path(dest, name).write_text(canonical_json(value), encoding="utf-8")
print("slices:", ", ".join(slices), "->", dest)
EOF
    exit $?
fi

bundle=$(cd "$2" && pwd) out=$3
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
[[ -f $here/wheelhouse.sh ]] || here=$(cd "$here/../scripts" && pwd)  # in the tree, beside them in a bundle
if [[ ! -d /tmp/site/vllm ]]; then
    bash "$here/wheelhouse.sh" join "$parts" /tmp/wheelhouse || exit 1
    bash "$here/wheelhouse.sh" install /tmp/wheelhouse /tmp/site || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$bundle"/atlas-*.whl || exit 1
# the node's own torch and CUDA libraries; the wheelhouse's packages (verl's transformers and
# tokenizers among them) first
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
if ! command -v bwrap > /dev/null && [[ -d $bundle/debs ]]; then
    PATH=$(bash "$here/bwrap_from_deb.sh" "$bundle/debs" /var/tmp/atlas-bwrap):$PATH
fi
echo "bwrap: $(command -v bwrap)" | tee "$out/bwrap.txt"
export VLLM_USE_FLASHINFER_SAMPLER=0 ATLAS_VLLM_TOKEN_TABLE=1 RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c "import torch, vllm, verl, xgrammar, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, 'verl', verl.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -1 | tee "$out/versions.txt"

run=/tmp/atlas/run ck=/tmp/atlas/checkpoints
if [[ $what == run ]]; then  # a fresh run: nothing left of an earlier one
    pkill -KILL -f atlas.stages.train_verl; python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
    rm -rf /tmp/atlas
fi
deadline=${DEADLINE_S:-560}  # seconds after this script started: what is left is still collected
launch() {
    python3 -m atlas.stages.train_verl --config-slice "$(cat "$bundle/slice.json")" \
        --train "$bundle/data/train.parquet" --val "$bundle/data/val.parquet" \
        --tests "$bundle/data/tests.parquet" --model "$bundle/model" --checkpoints "$ck" --out "$run" \
        > "$out/driver_$1.log" 2>&1 &
    lpid=$!
}
# wait for the launch until it exits, `until` holds, or the deadline; then kill its process group
watch() {
    while kill -0 "$lpid" 2>/dev/null && ((SECONDS < deadline)); do
        eval "$1" && break
        sleep 2
    done
    if kill -0 "$lpid" 2>/dev/null; then
        echo "killing launch $2 at ${SECONDS}s, verl's latest checkpoint: $(cat "$marker" 2>/dev/null)" | tee -a "$out/kill.txt"
        kill -KILL -- "-$lpid"
    fi
    wait "$lpid"
    last_exit=$?
    echo "launch $2 exit $last_exit at ${SECONDS}s" | tee -a "$out/kill.txt"
    python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1 || true
}
collect() {
    cp "$ck"/verl/launch_*.log "$ck"/verl/metrics_*.jsonl "$ck"/verl/episode_counts.json "$out/" 2>/dev/null
    # everything the checks read (verl_checkpoints.json lists the checkpoints' huggingface/
    # config and tokenizer files); only full model weights and verl's rollout dumps stay behind
    local have=()
    for d in run checks checks.distributed checkpoints; do [[ -e /tmp/atlas/$d ]] && have+=("$d"); done
    ((${#have[@]})) && tar -C /tmp/atlas -czf "$out/verl_run.tgz" --exclude='huggingface/*.safetensors' \
        --exclude=rollouts "${have[@]}"
}
# the workflow's checks of the run (rules/checks.smk): the 2-rank roundtrip of its last
# checkpoint, then the checkpoint, roundtrip and batch checks
checks() {
    [[ -f $bundle/checks.json ]] || return 0
    local rc
    timeout "${CHECKS_S:-600}" env OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 -m atlas.stages.distributed_roundtrip \
        --config-slice "$(cat "$bundle/roundtrip.json")" --model "$bundle/model" --run-folder "$run" \
        --out /tmp/atlas/checks.distributed > "$out/distributed_roundtrip.log" 2>&1
    rc=$?
    echo "distributed_roundtrip exit $rc at ${SECONDS}s" | tee -a "$out/kill.txt"
    ((rc == 0)) || return 1
    timeout "${CHECKS_S:-600}" python3 -m atlas.stages.checks --config-slice "$(cat "$bundle/checks.json")" \
        --train "$bundle/data/train.parquet" --val "$bundle/data/val.parquet" \
        --tests "$bundle/data/tests.parquet" --model "$bundle/model" --checkpoints "$ck" \
        --run-folder "$run" --distributed /tmp/atlas/checks.distributed --out /tmp/atlas/checks \
        > "$out/checks.log" 2>&1
    rc=$?
    echo "checks exit $rc at ${SECONDS}s" | tee -a "$out/kill.txt"
    return $rc
}
marker=$ck/verl/checkpoints/latest_checkpointed_iteration.txt

[[ $what == run ]] && : > "$out/kill.txt"  # this run's launches only
kill_at=${KILL_AT_STEP:-1}
if [[ $what == run && $kill_at != 0 ]]; then
    # launch 1: killed as soon as verl has saved global step $kill_at
    launch 0
    watch '[[ -f $marker && $(cat $marker) == "$kill_at" ]]' 1
fi
# launch 2: resume_mode=auto picks up the latest global step, runs the rest, converts
launch 1
watch false 2
# the exit status: 0 when the last launch ended the run and its checks passed
status=1
if ((last_exit == 0)); then
    checks && status=0
fi
collect
ls -la "$out"
exit $status
