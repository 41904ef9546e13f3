"""Reliability: command-line options, names and environment values that used to raise a
traceback (docs/reliability.md)."""
