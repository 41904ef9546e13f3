"""Reused CPU kernel outputs (kernels.scratch): lent only inside a pool and a lending scope,
returned when the scope closes, never lent to the scope's result, and invisible in the output."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from speechlens_cli import checkpoint, kernels
from speechlens_cli.api import enhance
from speechlens_cli.kernels import cpu_ops, scratch
from speechlens_cli.synthetic.speech import noisy_speech


@pytest.fixture(autouse=True)
def _on_the_cpu():
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(previous)


def _address(lent) -> int:
    return lent[1].ctypes.data


def test_buffers_are_lent_in_a_scope_and_reused_by_the_next():
    assert scratch.take((4, 8)) is None  # no scope
    with kernels.lend_scratch():
        assert scratch.take((4, 8)) is None  # a scope but no pool: nothing to lend
    with kernels.scratch_pool():
        with kernels.lend_scratch() as scope:
            first = scratch.take((4, 8))
            other = scratch.take((32,))
            assert first is not None and other is not None
            assert _address(first) != _address(other)  # both lent at once: two buffers
            assert first[0].shape == (4, 8) and first[1].flags.writeable
            made = scope.result(lambda: scratch.take((4, 8)))
            assert made is None  # the scope's result is never lent
        with kernels.lend_scratch():
            again = scratch.take((8, 4))  # same element count, another shape
            assert _address(again) in (_address(first), _address(other))
            assert again[0].shape == (8, 4)
            with kernels.lend_scratch():
                assert scratch.take((4, 8)) is None  # an inner scope lends nothing
    with kernels.lend_scratch():
        assert scratch.take((4, 8)) is None  # the pool closed with the model call


def test_the_result_is_evaluated_before_the_buffers_go_back():
    with kernels.scratch_pool(), kernels.lend_scratch() as scope:
        out, view = scratch.take((16,))
        view[:] = np.arange(16, dtype=np.float32)
        total = scope.result(lambda: mx.sum(out * 2))  # lazy in MLX until evaluated
    with kernels.scratch_pool(), kernels.lend_scratch():
        pass
    view[:] = -1.0  # what a later scope's kernel would do to the returned buffer
    assert total.item() == 240.0


def test_a_model_with_reused_buffers_gives_the_same_output(tiny_checkpoint, monkeypatch):
    """Bit-identical with and without reuse, over windows of two lengths (the pool is keyed by
    element count), and far fewer fresh (zero-filled) outputs."""
    model = checkpoint.load_model(tiny_checkpoint)
    signals = [noisy_speech(16000, seconds, seed=1).astype(np.float32) for seconds in (0.5, 0.3)]
    fresh = []
    original = cpu_ops._output_like

    def counted(shape, *inputs):
        fresh.append(shape)
        return original(shape, *inputs)

    monkeypatch.setattr(cpu_ops, "_output_like", counted)
    reused = [enhance(s, 16000, model=model) for s in signals]
    reused_fresh = len(fresh)
    fresh.clear()

    class NoPool:
        def __enter__(self):
            return None

        def __exit__(self, *_exc):
            return False

    monkeypatch.setattr(kernels, "scratch_pool", NoPool)
    plain = [enhance(s, 16000, model=model) for s in signals]
    for a, b in zip(reused, plain, strict=True):
        assert np.array_equal(a, b)
    blocks = 2 * len(model.TSMamba) * len(signals)  # BiMamba calls
    assert len(fresh) >= 5 * blocks  # in_proj x2, conv, x_proj, scan, merge per call
    assert reused_fresh <= len(fresh) - 4 * blocks + 5 * 2 * len(signals)


def test_another_thread_borrows_nothing_from_this_threads_pool():
    import threading

    seen = []
    with kernels.scratch_pool(), kernels.lend_scratch():
        assert scratch.take((8,)) is not None
        worker = threading.Thread(target=lambda: seen.append(scratch.take((8,))))
        worker.start()
        worker.join()
    assert seen == [None]


def test_free_buffers_of_other_sizes_go_once_the_pool_holds_too_much(monkeypatch):
    monkeypatch.setattr(scratch, "KEEP_BYTES", 4 * 100)
    with kernels.scratch_pool():
        with kernels.lend_scratch():
            small = scratch.take((40,))
        with kernels.lend_scratch():
            assert _address(scratch.take((40,))) == _address(small)  # kept: 160 bytes
            big = scratch.take((80,))  # 480 bytes held: over, but nothing free to let go
        with kernels.lend_scratch():
            assert _address(scratch.take((80,))) == _address(big)
            scratch.take((30,))  # over: the free 40-float buffer goes
            assert scratch._state.pools[-1].free[40] == []
        assert scratch._state.pools[-1].held == 4 * (80 + 30)
