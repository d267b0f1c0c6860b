"""The sequential tool runtime: tools, grammar, rollout engines, episodes, records, protocol checks."""
