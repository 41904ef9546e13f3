"""Deterministic stand-ins for what speechlens may not ship or download: checkpoints with
random weights in the official layout (``checkpoints``) and noisy synthetic speech
(``speech``). Used by ``speechlens bench``, the demo and the tests."""
