"""The names of the per-sample grammar-mask tensors the agent loop hands verl and the actor
reads (atlas.verl.actor): the distinct masks, flattened int32 words, and each response token's row."""

TABLE, INDEX = "grammar_mask_table", "grammar_mask_index"
