"""Question inputs: GPQA and LiveCodeBench readers, option shuffling, the ordered schedule."""
