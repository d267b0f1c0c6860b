"""Models: the locally built tiny tokenizer and model; base model loading."""
