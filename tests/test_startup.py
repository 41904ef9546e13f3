"""What a plain `speechlens enhance` of a WAV file imports: start-up time is paid per process
(docs/performance.md, Start-up), so what such a run does not use stays unimported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

#: Imported only where used: ONNX Runtime and the scoring package by `score` and --score,
#: huggingface_hub by downloads, Rich where stderr may be a terminal (the bars) and for a batch's
#: summary, importlib.metadata (~30 modules) by nothing a run needs, the scipy-openblas32
#: package not at all (blas.py loads its library by path), torch never.
NOT_FOR_A_WAV = ("onnxruntime", "huggingface_hub", "rich", "importlib.metadata",
                 "scipy_openblas32", "speechlens_cli.scoring", "torch")

_RUN = """
import json, sys
from speechlens_cli.__main__ import main
try:
    main(sys.argv[1:])
except SystemExit as done:
    assert not done.code, done.code
print(json.dumps(sorted(sys.modules)))
"""


def test_a_wav_enhance_imports_nothing_it_does_not_use(tmp_path, audio_dir, tiny_checkpoint):
    """Its stderr a pipe, as in a batch job's log: no terminal for Rich's bars."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    run = subprocess.run(
        [sys.executable, "-c", _RUN, "enhance", str(audio_dir / "mono_16000_pcm24.wav"),
         str(tmp_path / "out.wav"), "--model", str(tiny_checkpoint)],
        capture_output=True, text=True, check=True, env=env)
    loaded = set(json.loads(run.stdout.splitlines()[-1]))
    assert (tmp_path / "out.wav").is_file()
    assert loaded.isdisjoint(NOT_FOR_A_WAV), sorted(loaded.intersection(NOT_FOR_A_WAV))
