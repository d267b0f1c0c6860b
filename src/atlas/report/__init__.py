"""The report folder, results/report25/: polars tables, figures and the dataset card."""
