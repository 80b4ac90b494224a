"""Traces: one record per rollout joining its model calls and sandbox events; exported as
datasets, replayed, branched, and turned into token-exact training samples."""
