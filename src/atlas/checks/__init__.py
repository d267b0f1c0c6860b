"""The report's evidence that checkpoints, batches and rollouts are what they claim to be."""
