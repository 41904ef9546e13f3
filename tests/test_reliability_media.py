"""Reliability: media and encodings written and read back, media on stdin
(docs/reliability.md)."""
