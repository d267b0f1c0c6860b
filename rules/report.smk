# The report folder: the six tables, the records, the figures and the dataset card. It reads the
# finished run, check and validation folders, and is the only job that writes inside results/report25.


rule report:
    """results/report25/: polars tables, records, figures, README.md (HF dataset card)."""
    input:
        model=MODEL_DIR,
        runs=expand("results/runs/{run}", run=TRAINING_RUNS),
        dose_step=rules.dose_step.output,
        smoke=rules.smoke.output,
        boundary=rules.boundary.output,
        checks=expand("results/checks/{run}", run=TRAINING_RUNS),
        validation=expand(
            "results/validation/{policy}", policy=ATLAS.validation.policies
        ),
        perf=ATLAS.report.perf_files,
        code=code("atlas.stages.report"),
    output:
        directory("results/report25"),
    log:
        "results/logs/report.log",
    conda:
        "../envs/atlas.yaml"
    params:
        slice=stage_slice("report"),
    shell:
        "python -m atlas.stages.report --config-slice {params.slice:q} --model {input.model}"
        " --runs {input.runs} --dose-step {input.dose_step} --smoke {input.smoke}"
        " --boundary {input.boundary} --checks {input.checks} --validation {input.validation}"
        " --perf {input.perf}"
        " --out {output} > {log} 2>&1"
