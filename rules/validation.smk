# Full validation: one job per policy (the base model and each training run's final actor).


rule validation:
    """One policy (a training run's final actor, or the base) over the whole validation set."""
    input:
        val=rules.prepare_data.output.val,
        tests=rules.prepare_data.output.tests,
        model=MODEL_DIR,
        run=lambda wc: [] if wc.policy == "base" else [f"results/runs/{wc.policy}"],
        code=code("atlas.stages.validation"),
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
        gpu_mem_gb=ATLAS.resources.gpu_mem_gb("rollouts"),
    params:
        slice=stage_slice("validation"),
        run=lambda wc: (
            "" if wc.policy == "base" else f"--run-folder results/runs/{wc.policy}"
        ),
    shell:
        "OMP_NUM_THREADS={threads} ATLAS_GPU_MEM_GB={resources.gpu_mem_gb} python -m atlas.stages.validation --config-slice {params.slice:q}"
        " --val {input.val} --tests {input.tests} --model {input.model} --policy {wildcards.policy}"
        " {params.run} --out {output} > {log} 2>&1"
