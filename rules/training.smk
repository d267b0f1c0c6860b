# Training runs (the training smoke and the arms) and the dose step. Each run is its own job, so
# one arm rebuilds alone; its checkpoints live in results/checkpoints/<run>/, outside the declared
# output, where a rerun of an interrupted job finds them (resume_mode: auto).


rule train:
    """PPO on the ordered schedule for one run: records, step metrics, call advantages, wandb."""
    input:
        train=rules.prepare_data.output.train,
        val=rules.prepare_data.output.val,
        tests=rules.prepare_data.output.tests,
        model=MODEL_DIR,
        snapshot=lambda wc: snapshot_folder(ATLAS.runs[wc.run].snapshot_of),
        code=code(TRAIN_MODULE),
    output:
        directory("results/runs/{run}"),
    log:
        "results/logs/train_{run}.log",
    wildcard_constraints:
        run="|".join(TRAINING_RUNS),
    # Training runs first: they are the longest jobs, and an arm that freezes another run's critic
    # waits for that run, so starting them early shortens the whole pipeline.
    priority: 10
    conda:
        "../envs/atlas.yaml"
    threads: JOB_THREADS  # resources.threads: torch uses every thread it is given
    resources:
        gpu=ATLAS.resources.gpus,
        gpu_mem_gb=ATLAS.resources.gpu_mem_gb("training"),
    params:
        slice=lambda wc: canonical_json(config_slice(ATLAS, "training", wc.run)),
        snapshot=lambda wc: snapshot_arg(ATLAS.runs[wc.run].snapshot_of),
        module=TRAIN_MODULE,
        launch=TRAIN_LAUNCH,  # ranks share the job's threads (atlas.rl.distributed.start)
    shell:
        "OMP_NUM_THREADS={threads} ATLAS_GPU_MEM_GB={resources.gpu_mem_gb} {params.launch} -m {params.module} --config-slice {params.slice:q} --train {input.train}"
        " --val {input.val} --tests {input.tests} --model {input.model} {params.snapshot}"
        " --checkpoints results/checkpoints/{wildcards.run} --out {output} > {log} 2>&1"


rule dose_step:
    """One step from the same start at each dose, on identical rollouts."""
    input:
        train=rules.prepare_data.output.train,
        val=rules.prepare_data.output.val,
        tests=rules.prepare_data.output.tests,
        model=MODEL_DIR,
        snapshot=snapshot_folder(ATLAS.dose_step.snapshot_of),
        code=code("atlas.stages.dose_step"),
    output:
        directory("results/runs/dose_step"),
    log:
        "results/logs/dose_step.log",
    conda:
        "../envs/atlas.yaml"
    threads: JOB_THREADS  # resources.threads: torch uses every thread it is given
    resources:
        gpu=ATLAS.resources.gpus,
        gpu_mem_gb=ATLAS.resources.gpu_mem_gb("training"),
    params:
        slice=stage_slice("dose_step"),
        snapshot=snapshot_arg(ATLAS.dose_step.snapshot_of),
    shell:
        "OMP_NUM_THREADS={threads} ATLAS_GPU_MEM_GB={resources.gpu_mem_gb} python -m atlas.stages.dose_step --config-slice {params.slice:q} --train {input.train}"
        " --val {input.val} --tests {input.tests} --model {input.model} {params.snapshot}"
        " --out {output} > {log} 2>&1"
