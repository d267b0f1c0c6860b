if ATLAS.model.tiny is not None:

    rule build_tiny_model:
        """The embedded default's tokenizer and random-init Qwen3 model, built locally."""
        input:
            corpus=ATLAS.model.tiny.corpus,
            code=code("atlas.stages.build_tiny_model"),
        output:
            directory(MODEL_DIR),
        log:
            f"results/logs/build_model_{ATLAS.model.name}.log",
        conda:
            "../envs/atlas.yaml"
        params:
            slice=stage_slice("model"),
        shell:
            "python -m atlas.stages.build_tiny_model --config-slice {params.slice:q} --out {output} > {log} 2>&1"
