# The report folder: the six tables, the records, the figures and the dataset card. It reads the
# finished run, check and validation folders, and is the only job that writes inside results/report25.
# `snakemake --report results/report25.html` shows its figures and tables (captions in
# report/caption.rst, one category per stage) beside the workflow's description and run statistics.


report: "../report/workflow.rst"


# The stage each figure and table of the report folder belongs to: its category in the report.
REPORT_STAGES = {
    "figure": {
        "step_metrics": "Training",
        "call_advantage": "Training",
        "validation_curves": "Validation",
        "perf_stack": "Performance",
    },
    "table": {
        "step_metrics_by_run": "Training",
        "arms_step_metrics": "Training",
        "arms_call_advantage": "Training",
        "full_validation_views": "Validation",
        "arms_validation_curve": "Validation",
        "perf_stack": "Performance",
    },
}


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
        code=code("atlas.stages.report"),
    output:
        report(
            directory("results/report25"),
            patterns=["figures/{figure}.png", "tables/{table}.csv"],
            caption="../report/caption.rst",
            # wildcards: figure=<name> for a figure, table=<name> for a table
            category=lambda w: next(REPORT_STAGES[k][v] for k, v in w.items()),
            subcategory=lambda w: "Figures" if "figure" in w.keys() else "Tables",
        ),
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
        " --out {output} > {log} 2>&1"
