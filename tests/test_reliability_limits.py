"""Reliability, memory limits, launcher variables and settings from the environment (docs/reliability.md)."""
