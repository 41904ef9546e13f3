"""Each BiMamba's two-direction weights are derived once and kept while its parameters stay;
weights loaded into the same model afterwards are used, not the ones derived before."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from speechlens_cli import checkpoint
from speechlens_cli.model.mamba import BiMamba
from speechlens_cli.synthetic.checkpoints import TINY_CONFIG, make_weights, write_checkpoint
from speechlens_cli.synthetic.speech import noisy_speech

RATE = 8000


def bimambas(model) -> list[BiMamba]:
    return [module for _, module in model.named_modules() if isinstance(module, BiMamba)]


def test_derived_weights_follow_the_parameters(tiny_checkpoint, tmp_path):
    """Kept across windows; after another checkpoint's weights are loaded into the model, its
    output is that checkpoint's (equal to a model loaded from it), not the first one's."""
    model = checkpoint.load_model(tiny_checkpoint)
    kept = [bimamba.weights() for bimamba in bimambas(model)]
    assert all(bimamba.weights() is weights
               for bimamba, weights in zip(bimambas(model), kept, strict=True))

    other = checkpoint.sanitize(make_weights(TINY_CONFIG, seed=7))
    model.load_weights([(name, mx.array(value)) for name, value in other.items()], strict=False)
    signal = mx.array(noisy_speech(RATE, 0.3)[None])
    reloaded = np.asarray(model.enhance(signal, RATE))
    assert all(bimamba.weights() is not weights
               for bimamba, weights in zip(bimambas(model), kept, strict=True))

    fresh = checkpoint.load_model(write_checkpoint(tmp_path, TINY_CONFIG, seed=7))
    np.testing.assert_array_equal(reloaded, np.asarray(fresh.enhance(signal, RATE)))
    first = np.asarray(checkpoint.load_model(tiny_checkpoint).enhance(signal, RATE))
    assert np.abs(reloaded - first).max() > 1e-3   # the two checkpoints do differ
