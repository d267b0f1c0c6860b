rule smoke:
    """Base-model rollouts over a slice of the validation set: records and protocol counts."""
    input:
        val=rules.prepare_data.output.val,
        tests=rules.prepare_data.output.tests,
        model=MODEL_DIR,
        code=code("atlas.stages.smoke"),
    output:
        directory("results/runs/smoke"),
    log:
        "results/logs/smoke.log",
    conda:
        "../envs/atlas.yaml"
    threads: JOB_THREADS  # resources.threads: torch uses every thread it is given
    resources:
        gpu=min(1, ATLAS.resources.gpus),  # the base model generates on the GPU it is given
        gpu_mem_gb=ATLAS.resources.gpu_mem_gb("rollouts"),
    params:
        slice=stage_slice("smoke"),
    shell:
        "OMP_NUM_THREADS={threads} ATLAS_GPU_MEM_GB={resources.gpu_mem_gb} python -m atlas.stages.smoke --config-slice {params.slice:q} --val {input.val}"
        " --tests {input.tests} --model {input.model} --out {output} > {log} 2>&1"


rule boundary:
    """One scripted episode per runtime boundary, each asserted in boundary.json."""
    input:
        val=rules.prepare_data.output.val,
        tests=rules.prepare_data.output.tests,
        model=MODEL_DIR,
        code=code("atlas.stages.boundary"),
    output:
        directory("results/runs/boundary"),
    log:
        "results/logs/boundary.log",
    conda:
        "../envs/atlas.yaml"
    threads: JOB_THREADS  # resources.threads: torch uses every thread it is given
    resources:
        gpu=min(1, ATLAS.resources.gpus),  # the base model generates on the GPU it is given
        gpu_mem_gb=ATLAS.resources.gpu_mem_gb("rollouts"),
    params:
        slice=stage_slice("boundary"),
    shell:
        "OMP_NUM_THREADS={threads} ATLAS_GPU_MEM_GB={resources.gpu_mem_gb} python -m atlas.stages.boundary --config-slice {params.slice:q} --val {input.val}"
        " --tests {input.tests} --model {input.model} --out {output} > {log} 2>&1"
