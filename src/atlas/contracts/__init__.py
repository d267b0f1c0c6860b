"""The files the stages write, declared once by their writers and read by everyone.

    questions.py   results/data/{train,val,tests}.parquet; the GPQA answer letters
    records.py     records.parquet and trajectories.parquet of every rollout folder
    protocol.py    the counts every protocol.json and validation.json holds
    runs.py        the step-metric catalogue and the derived tables of a run folder
                   (step_metrics, call_advantages, validation)
    answers.py     the table of a full-validation folder (answers)
    parquet.py     reading one of these files whole (`read_table`), building one to a schema
                   (`arrow_table`)

Each module imports only pyarrow (and polars for the writers' conversion), so a stage's code
inputs hold only the contracts it writes or reads: editing one file's schema reruns its writer
and its readers, and nothing else. This package file imports nothing for the same reason.
"""
