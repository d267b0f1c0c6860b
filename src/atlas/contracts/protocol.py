"""The protocol counts: every protocol.json, validation.json and step-metrics row holds them."""

from __future__ import annotations

# episodes; those that ended with an executed submit; generations; execution records (one per
# generation); parsed tool calls (one per generation); protocol violations (must be 0).
PINNED_COUNTS = ("episodes", "completed", "generations", "records", "calls", "violations")
