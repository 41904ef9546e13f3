"""Print the MLX model's waveform parity with the float64 reference, for the record.

Run from the repository root: `python tests/parity_report.py` (CPU) or on a GPU host. Uses the
generated fixture checkpoints (tiny at 8/16/44.1/48 kHz, full size at 16 kHz), both scan modes.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from speechlens_cli import runtime  # noqa: E402

runtime.prepare()  # before MLX is imported: the fast BLAS on Linux CPUs, full float32
import mlx.core as mx  # noqa: E402,I001
import numpy as np  # noqa: E402
import reference as ref  # noqa: E402
from speechlens_cli.synthetic.speech import noisy_speech  # noqa: E402
from speechlens_cli.synthetic.checkpoints import (  # noqa: E402
    FULL_CONFIG,
    TINY_CONFIG,
    make_weights,
    write_checkpoint,
)
from speechlens_cli import checkpoint, kernels  # noqa: E402


def rel_rmse(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.sqrt(np.mean((actual - expected) ** 2) / np.mean(expected**2)))


def main() -> None:
    print(f"backend {kernels.backend()}, mlx {mx.__version__}, device {mx.default_device()}")
    cases = (("tiny", TINY_CONFIG, (8000, 16000, 44100, 48000), None),
             ("full", FULL_CONFIG, (16000,), 4001))
    with tempfile.TemporaryDirectory() as folder:
        for name, config, rates, length in cases:
            model = checkpoint.load_model(write_checkpoint(Path(folder) / name, config))
            weights = make_weights(config)
            for rate in rates:
                n = length or rate // 4 + 7
                x = noisy_speech(rate, n / rate + 0.01, seed=1)[:n].astype(np.float32)
                expected = ref.reference_enhance(weights, config, x.astype(np.float64), rate)
                for strict in (False, True):
                    y = np.array(model.enhance(mx.array(x)[None], rate, strict=strict))[0]
                    print(f"{name:4s} {rate:5d} Hz N={n:5d} {'strict  ' if strict else 'standard'}"
                          f" waveform rel RMSE {rel_rmse(y, expected):.2e}")


if __name__ == "__main__":
    main()
