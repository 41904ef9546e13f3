"""Shared pytest fixtures: synthetic checkpoints (official layout) and audio files.

Everything is generated deterministically into per-session temporary folders, once per
session. NVIDIA's weights are never downloaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.audio import write_audio_fixtures
from fixtures.media import write_media_fixtures
from speechlens_cli.synthetic.checkpoints import FULL_CONFIG, TINY_CONFIG, write_checkpoint

ATTENUATED_PHASE_GAIN = 1e-4


@pytest.fixture(scope="session", autouse=True)
def private_cache_folder(tmp_path_factory):
    """The run's own cache folder (SPEECHLENS_CACHE_DIR, inherited by the CLI's child
    processes): what speechlens keeps between runs (compiled kernels, self-check verdicts, the
    measured speeds its estimates use) neither comes from the user's folder into a test nor goes
    from a test into it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPEECHLENS_CACHE_DIR", str(tmp_path_factory.mktemp("speechlens-cache")))
        yield


@pytest.fixture
def on_cpu():
    """MLX's CPU device for one test, then the device before it again: for what only the CPU
    backend has (its library's settings, the up-front window memory check), on any machine.
    A CLI call in such a test passes --device cpu too (auto would pick a GPU)."""
    import mlx.core as mx  # here: runtime.prepare() must load the BLAS before mlx.core is imported

    before = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(before)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """Tiny checkpoint (2 blocks, 16 channels), phase path at full strength."""
    return write_checkpoint(tmp_path_factory.mktemp("ckpt_tiny"), TINY_CONFIG, seed=0,
                            phase_gain=1.0)


@pytest.fixture(scope="session")
def tiny_checkpoint_attenuated(tmp_path_factory) -> Path:
    """Tiny checkpoint whose encoder barely reads the phase (parity insensitive to frame-0 +-pi)."""
    return write_checkpoint(tmp_path_factory.mktemp("ckpt_tiny_att"), TINY_CONFIG, seed=0,
                            phase_gain=ATTENUATED_PHASE_GAIN)


@pytest.fixture(scope="session")
def full_checkpoint(tmp_path_factory) -> Path:
    """Full-size checkpoint (1,416 tensors, 9,607,747 parameters), phase path at full strength."""
    return write_checkpoint(tmp_path_factory.mktemp("ckpt_full"), FULL_CONFIG, seed=0,
                            phase_gain=1.0)


@pytest.fixture(scope="session")
def full_checkpoint_attenuated(tmp_path_factory) -> Path:
    """Full-size checkpoint whose encoder barely reads the phase."""
    return write_checkpoint(tmp_path_factory.mktemp("ckpt_full_att"), FULL_CONFIG, seed=0,
                            phase_gain=ATTENUATED_PHASE_GAIN)


@pytest.fixture(scope="session")
def audio_dir(tmp_path_factory) -> Path:
    """Folder holding fixtures.audio.AUDIO_FIXTURES (mono 8/16/44.1/48 kHz, stereo 16 kHz)."""
    directory = tmp_path_factory.mktemp("audio")
    write_audio_fixtures(directory)
    return directory


@pytest.fixture(scope="session")
def media_files(tmp_path_factory) -> dict[str, Path]:
    """fixtures.media's phone recording, video, web call, podcast and 5.1 file, by kind."""
    return write_media_fixtures(tmp_path_factory.mktemp("media"))
