#!/usr/bin/env bash
# A crash drill: one training run through Snakemake, killed as a crash would kill it as soon as it
# has saved its first checkpoint; the same Snakemake command with --rerun-incomplete then resumes
# it from that checkpoint (resume_mode: auto).
#
#   bash scripts/drill.sh RUN [SNAKEMAKE ARGS ...]
#
# Runs `$PYTHON -m snakemake results/runs/RUN ARGS` (PYTHON: default python3) in a session of its
# own, waits for the run's first checkpoint under results/checkpoints/RUN (the local trainer's
# complete step_<k>/, which holds a MANIFEST.json, or verl's latest_checkpointed_iteration.txt),
# then sends SIGKILL to the whole session (Snakemake, its jobs and what they started) and, where
# Ray is installed, stops every Ray process on the node (a killed verl job leaves its cluster and
# vLLM's GPU memory behind: run the drill on a node of your own). Prints when it killed and which
# checkpoints were left. Exit 0 once it has killed the run at a checkpoint; 1 when the run ended
# first, with Snakemake's exit status.
set -uo pipefail
run=${1:?usage: drill.sh RUN [SNAKEMAKE ARGS ...]}
shift
py=${PYTHON:-python3}
ck=results/checkpoints/$run
"$py" -m snakemake "$@" --unlock > /dev/null 2>&1
SECONDS=0
setsid "$py" -m snakemake "results/runs/$run" "$@" &
pid=$!
saved=""
while kill -0 "$pid" 2> /dev/null; do
    saved=$(ls -d "$ck"/step_*/MANIFEST.json "$ck"/verl/checkpoints/latest_checkpointed_iteration.txt 2> /dev/null | head -1)
    [[ -n $saved ]] && break
    sleep 1
done
if [[ -z $saved ]]; then
    wait "$pid"
    rc=$?
    echo "drill: $run ended (Snakemake's exit $rc) after ${SECONDS} s, before it saved a checkpoint"
    exit 1
fi
pkill -KILL -s "$pid"
wait "$pid" 2> /dev/null
if "$py" -c "import ray" 2> /dev/null; then
    "$py" -m ray.scripts.scripts stop --force > /dev/null 2>&1
fi
"$py" -m snakemake "$@" --unlock > /dev/null 2>&1
echo "drill: killed Snakemake's session (SIGKILL) ${SECONDS} s after the start, once $saved existed"
echo "drill: checkpoints left: $(cd "$ck" && ls -d step_* verl/checkpoints/global_step_* 2> /dev/null | tr '\n' ' ')"
