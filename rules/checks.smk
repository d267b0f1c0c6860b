# The checks of one training run: the distributed roundtrip of its last checkpoint (torchrun), then
# the checkpoint, roundtrip, batch and timing records of results/checks/<run>/.


rule checks:
    """Checkpoint, roundtrip and batch checks of one training run."""
    input:
        run="results/runs/{run}",
        train=rules.prepare_data.output.train,
        val=rules.prepare_data.output.val,
        tests=rules.prepare_data.output.tests,
        model=MODEL_DIR,
        snapshot=lambda wc: snapshot_folder(ATLAS.runs[wc.run].snapshot_of),
        distributed="results/checks/{run}.distributed",
        code=code("atlas.stages.checks"),
    output:
        directory("results/checks/{run}"),
    log:
        "results/logs/checks_{run}.log",
    wildcard_constraints:
        run="|".join(TRAINING_RUNS),
    conda:
        "../envs/atlas.yaml"
    threads: JOB_THREADS
    resources:
        gpu=min(1, ATLAS.resources.gpus),  # fresh policies and a resumed step on the run's device
        gpu_mem_gb=ATLAS.resources.gpu_mem_gb("checks"),
    params:
        slice=lambda wc: canonical_json(config_slice(ATLAS, "checks", wc.run)),
        snapshot=lambda wc: snapshot_arg(ATLAS.runs[wc.run].snapshot_of),
    shell:
        "OMP_NUM_THREADS={threads} ATLAS_GPU_MEM_GB={resources.gpu_mem_gb} python -m atlas.stages.checks --config-slice {params.slice:q}"
        " --train {input.train} --val {input.val} --tests {input.tests} --model {input.model}"
        " {params.snapshot} --checkpoints results/checkpoints/{wildcards.run}"
        " --run-folder {input.run} --distributed {input.distributed} --out {output} > {log} 2>&1"


rule distributed_roundtrip:
    """The last checkpoint in an FSDP2-sharded policy, one step on 2 ranks under torchrun."""
    input:
        run="results/runs/{run}",
        model=MODEL_DIR,
        code=code("atlas.stages.distributed_roundtrip"),
    output:
        temp(directory("results/checks/{run}.distributed")),
    log:
        "results/logs/distributed_roundtrip_{run}.log",
    wildcard_constraints:
        run="|".join(TRAINING_RUNS),
    conda:
        "../envs/atlas.yaml"
    threads: JOB_THREADS  # shared by the two ranks: on one GPU they compute on the CPU (gloo)
    resources:
        gpu=2 if ATLAS.resources.gpus >= 2 else 0,  # NCCL needs a GPU per rank, else gloo on the CPU
    params:
        slice=stage_slice("distributed_roundtrip"),
    shell:
        "OMP_NUM_THREADS={threads} torchrun --standalone --nproc-per-node 2 -m atlas.stages.distributed_roundtrip"
        " --config-slice {params.slice:q} --model {input.model} --run-folder {input.run}"
        " --out {output} > {log} 2>&1"
