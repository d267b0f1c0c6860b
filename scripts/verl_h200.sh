#!/usr/bin/env bash
# The verl engine on one GPU node without a package index: a run of atlas.verl.launch with vLLM
# rollouts, killed after its first step and launched again (resume_mode=auto), then converted.
#
# Where files arrive a few tens of MiB at a time, the wheelhouse (scripts/wheelhouse.sh build
# scripts/wheels/verl-vllm-h200.txt DIR; split DIR PARTS) comes in parts:
#   bash scripts/verl_h200.sh part PARTS_DIR            keep the parts that arrived (in /tmp/parts)
#   bash scripts/verl_h200.sh run BUNDLE OUT            join + install the wheelhouse, then the run
#   bash scripts/verl_h200.sh resume BUNDLE OUT         the second launch alone (a run cut short)
# BUNDLE holds: atlas-*.whl (the project, for its vllm.general_plugins entry point), slice.json
# (the training stage's config slice, engine verl), model/ and data/ (results/models/<m>,
# results/data), this folder's scripts, and debs/ (bubblewrap for the graders' sandbox, unpacked
# by bwrap_from_deb.sh where the node has no bwrap). OUT receives the logs, the episode counts and a tar of
# the run folder and the verl checkpoints' index.
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

bundle=$(cd "$2" && pwd) out=$3
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
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
    echo "launch $2 exit $? at ${SECONDS}s" | tee -a "$out/kill.txt"
    python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1 || true
}
collect() {
    cp "$ck"/verl/launch_*.log "$ck"/verl/metrics_*.jsonl "$ck"/verl/episode_counts.json "$out/" 2>/dev/null
    tar -C /tmp/atlas -czf "$out/verl_run.tgz" --exclude='huggingface' run checkpoints 2>/dev/null
}
marker=$ck/verl/checkpoints/latest_checkpointed_iteration.txt

if [[ $what == run ]]; then
    # launch 1: killed as soon as verl has saved global step 1
    launch 0
    watch '[[ -f $marker && $(cat $marker) == 1 ]]' 1
fi
# launch 2: resume_mode=auto picks up global step 1, runs step 2, converts
launch 1
watch false 2
collect
ls -la "$out"
grep -h "launch 2 exit 0" "$out/kill.txt" > /dev/null
