"""Reliability, media and encodings written and read back, and media on stdin (docs/reliability.md)."""
