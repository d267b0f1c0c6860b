rule prepare_data:
    """Ordered question inputs: GPQA + LCB readers, overlap checks, the training schedule."""
    input:
        gpqa_train=ATLAS.data.gpqa.train,
        gpqa_val=ATLAS.data.gpqa.val,
        lcb_train=ATLAS.data.lcb.train,
        lcb_val=ATLAS.data.lcb.val,
        code=code("atlas.stages.prepare_data"),
    output:
        train="results/data/train.parquet",
        val="results/data/val.parquet",
        tests="results/data/tests.parquet",
        manifest="results/data/MANIFEST.json",
    log:
        "results/logs/prepare_data.log",
    conda:
        "../envs/atlas.yaml"
    params:
        slice=stage_slice("data"),
        out=lambda wildcards, output: os.path.dirname(output.manifest),
    shell:
        "python -m atlas.stages.prepare_data --config-slice {params.slice:q} --out {params.out} > {log} 2>&1"
