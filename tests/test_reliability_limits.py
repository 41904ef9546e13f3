"""Reliability: memory limits, launcher variables, settings from the environment
(docs/reliability.md)."""
