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
        snapshot=lambda wc: snapshot_folder(ATLAS.training.runs[wc.run].snapshot_of),
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
    params:
        slice=lambda wc: canonical_json(config_slice(ATLAS, "training", wc.run)),
        snapshot=lambda wc: snapshot_arg(ATLAS.training.runs[wc.run].snapshot_of),
        module=TRAIN_MODULE,
    shell:
        "OMP_NUM_THREADS={threads} python -m {params.module} --config-slice {params.slice:q} --train {input.train}"
        " --val {input.val} --tests {input.tests} --model {input.model} {params.snapshot}"
        " --checkpoints results/checkpoints/{wildcards.run} --out {output} > {log} 2>&1"


rule dose_step:
    """One step from the same start at each dose, on identical rollouts."""
    input:
        train=rules.prepare_data.output.train,
        val=rules.prepare_data.output.val,
        tests=rules.prepare_data.output.tests,
        model=MODEL_DIR,
        snapshot=snapshot_folder(ATLAS.training.dose_step.snapshot_of),
        code=code("atlas.rl.dose"),
    output:
        directory("results/runs/dose_step"),
    log:
        "results/logs/dose_step.log",
    conda:
        "../envs/atlas.yaml"
    threads: JOB_THREADS  # resources.threads: torch uses every thread it is given
    resources:
        gpu=ATLAS.resources.gpus,
    params:
        slice=stage_slice("dose_step"),
        snapshot=snapshot_arg(ATLAS.training.dose_step.snapshot_of),
    shell:
        "OMP_NUM_THREADS={threads} python -m atlas.rl.dose --config-slice {params.slice:q} --train {input.train}"
        " --val {input.val} --tests {input.tests} --model {input.model} {params.snapshot}"
        " --out {output} > {log} 2>&1"


rule checks:
    """Checkpoint, roundtrip and batch checks of one training run."""
    input:
        run="results/runs/{run}",
        train=rules.prepare_data.output.train,
        val=rules.prepare_data.output.val,
        tests=rules.prepare_data.output.tests,
        model=MODEL_DIR,
        snapshot=lambda wc: snapshot_folder(ATLAS.training.runs[wc.run].snapshot_of),
        distributed="results/checks/{run}.distributed",
        code=code("atlas.checks.stage"),
    output:
        directory("results/checks/{run}"),
    log:
        "results/logs/checks_{run}.log",
    wildcard_constraints:
        run="|".join(TRAINING_RUNS),
    conda:
        "../envs/atlas.yaml"
    threads: JOB_THREADS
    params:
        slice=lambda wc: canonical_json(config_slice(ATLAS, "checks", wc.run)),
        snapshot=lambda wc: snapshot_arg(ATLAS.training.runs[wc.run].snapshot_of),
    shell:
        "OMP_NUM_THREADS={threads} python -m atlas.checks.stage --config-slice {params.slice:q}"
        " --train {input.train} --val {input.val} --tests {input.tests} --model {input.model}"
        " {params.snapshot} --checkpoints results/checkpoints/{wildcards.run}"
        " --run-folder {input.run} --distributed {input.distributed} --out {output} > {log} 2>&1"


rule distributed_roundtrip:
    """The last checkpoint in an FSDP2-sharded policy, one step on 2 ranks under torchrun."""
    input:
        run="results/runs/{run}",
        model=MODEL_DIR,
        code=code("atlas.checks.distributed"),
    output:
        temp(directory("results/checks/{run}.distributed")),
    log:
        "results/logs/distributed_roundtrip_{run}.log",
    wildcard_constraints:
        run="|".join(TRAINING_RUNS),
    conda:
        "../envs/atlas.yaml"
    threads: 1  # two one-thread ranks that mostly wait on imports and on each other
    resources:
        gpu=min(2, ATLAS.resources.gpus),
    params:
        training=lambda wc: canonical_json(
            config_slice(ATLAS, "training", wc.run)["training"]
        ),
        seed=ATLAS.seed,
    shell:
        "OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 -m atlas.checks.distributed"
        " --model {input.model} --run-folder {input.run} --training {params.training:q}"
        " --seed {params.seed} --out {output} > {log} 2>&1"


rule validation:
    """One policy (a training run's final actor, or the base) over the whole validation set."""
    input:
        val=rules.prepare_data.output.val,
        tests=rules.prepare_data.output.tests,
        model=MODEL_DIR,
        run=lambda wc: [] if wc.policy == "base" else [f"results/runs/{wc.policy}"],
        code=code("atlas.checks.validation"),
    output:
        directory("results/validation/{policy}"),
    log:
        "results/logs/validation_{policy}.log",
    wildcard_constraints:
        policy="|".join(["base", *TRAINING_RUNS]),
    conda:
        "../envs/atlas.yaml"
    threads: JOB_THREADS
    resources:
        gpu=min(1, ATLAS.resources.gpus),
    params:
        slice=stage_slice("validation"),
        run=lambda wc: (
            "" if wc.policy == "base" else f"--run-folder results/runs/{wc.policy}"
        ),
    shell:
        "OMP_NUM_THREADS={threads} python -m atlas.checks.validation --config-slice {params.slice:q}"
        " --val {input.val} --tests {input.tests} --model {input.model} --policy {wildcards.policy}"
        " {params.run} --out {output} > {log} 2>&1"
