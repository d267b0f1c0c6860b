"""The chat and tool-call format's token strings, shared by the tiny model and the runtime.

Qwen-family checkpoints use the same strings, so the runtime serves the tiny model and a real one
alike; the runtime imports these, never the tiny builder.
"""

PAD = "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
