"""The conveyor: many files through the model with reading ahead of it and writing behind it.

Stand-in window functions keep most of these fast; one test runs the tiny model. Each test that
waits on another thread does so with a timeout, so a conveyor that does not overlap its stages
fails the test rather than hanging it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from speechlens_cli import api, checkpoint, conveyor
from speechlens_cli.audio import OutputFormat
from speechlens_cli.conveyor import READ_AHEAD, Conveyor, Finished, Work
from speechlens_cli.errors import AudioInputError, EnhancementError
from speechlens_cli.pipeline import Geometry, enhance_stream
from speechlens_cli.synthetic.speech import noisy_speech

RATE = 8000
FLOAT_WAV = OutputFormat("WAV", "FLOAT")
WAIT_S = 20.0


def write(path: Path, seconds: float, seed: int = 0, channels: int = 1) -> Path:
    sf.write(str(path), noisy_speech(RATE, seconds, channels=channels, seed=seed), RATE,
             subtype="FLOAT")
    return path


def work(tmp_path: Path, name: str, seconds: float, fn, geometry=None, seed: int = 0) -> Work:
    source = write(tmp_path / f"{name}.wav", seconds, seed)
    plan = api.plan_file(source, tmp_path / "out" / f"{name}.wav",
                         api.EnhanceOptions(subtype="FLOAT"), create_folders=True,
                         root=tmp_path / "out")
    return Work(plan, geometry or Geometry(plan.info.frames, 0), fn)


def halve(window: np.ndarray) -> np.ndarray:
    return window * np.float32(0.5)


def run_all(items, **kwargs) -> list:
    with Conveyor(items, **kwargs) as belt:
        return list(belt)


def no_temporaries(folder: Path) -> bool:
    return not [p for p in folder.rglob("*") if p.name.endswith(".partial")]


def test_outcomes_come_in_order_and_a_bad_file_fails_alone(tmp_path):
    """Items passed through keep their places; a file the model fails on, and a file deleted
    after planning, fail with their own error and leave no output; the others are written."""
    def refuse(window):
        raise EnhancementError("no")

    items = [work(tmp_path, "a", 0.3, halve), "passed", work(tmp_path, "b", 0.2, refuse),
             work(tmp_path, "c", 0.4, halve), work(tmp_path, "d", 0.2, halve)]
    items[4].plan.source.unlink()
    outcomes = run_all(items)
    assert [type(o).__name__ for o in outcomes] == \
        ["Finished", "str", "EnhancementError", "Finished", "AudioInputError"]
    assert outcomes[1] == "passed" and isinstance(outcomes[4], AudioInputError)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["a.wav", "c.wav"]
    for name in ("a", "c"):
        assert np.array_equal(sf.read(out / f"{name}.wav", dtype="float32")[0],
                              sf.read(tmp_path / f"{name}.wav", dtype="float32")[0] * 0.5)


def test_every_file_is_the_one_thread_pipelines_result(tmp_path, tiny_checkpoint):
    """The tiny model over one-window and many-window files (a residual too): each output, byte
    for byte, what pipeline.enhance_stream writes for that file alone."""
    model = checkpoint.load_model(tiny_checkpoint)

    def enhance(window):
        return api.enhance_channels(model, window, RATE, False)

    files = [(0.3, None), (0.55, Geometry(800, 200)), (0.35, Geometry(1000, 0)), (0.2, None)]
    items = [work(tmp_path, f"f{i}", seconds, enhance, geometry, seed=i)
             for i, (seconds, geometry) in enumerate(files)]
    items[1] = Work(api.plan_residual(items[1].plan, tmp_path / "out" / "f1_removed.wav",
                                      create_folders=True),
                    items[1].geometry, enhance)
    outcomes = run_all(items)
    assert [o.stream.windows for o in outcomes] == [1, 7, 3, 1]
    for item in items:
        alone = tmp_path / "alone.wav"
        enhance_stream(item.plan.source, alone, enhance, item.geometry, item.plan.output)
        assert item.plan.destination.read_bytes() == alone.read_bytes()
    removed = sf.read(tmp_path / "out" / "f1_removed.wav", dtype="float32")[0]
    original = sf.read(items[1].plan.source, dtype="float32")[0]
    enhanced = sf.read(items[1].plan.destination, dtype="float32")[0]
    np.testing.assert_allclose(removed, original - enhanced, atol=1e-6)


def test_the_next_file_is_read_while_the_model_runs(tmp_path, monkeypatch):
    """The model's first window waits for the second file to be opened: a conveyor that reads
    only after the model would time out here."""
    opened = threading.Event()
    real_open = conveyor.audio_io.open_reader

    def open_reader(path, name, info):
        if Path(path).name == "b.wav":
            opened.set()
        return real_open(path, name, info)

    monkeypatch.setattr(conveyor.audio_io, "open_reader", open_reader)

    def wait_for_b(window):
        assert opened.wait(WAIT_S), "b.wav was not read while the model ran a.wav"
        return halve(window)

    items = [work(tmp_path, "a", 0.3, wait_for_b), work(tmp_path, "b", 0.3, halve)]
    assert all(isinstance(o, Finished) for o in run_all(items))


def test_a_finished_file_is_written_while_the_model_runs_the_next(tmp_path):
    """The model's window of the second file waits for the first file's output to be in place."""
    items = [work(tmp_path, "a", 0.3, halve)]

    def wait_for_a(window):
        published = threading.Event()
        for _ in range(int(WAIT_S / 0.01)):
            if items[0].plan.destination.exists():
                published.set()
                break
            published.wait(0.01)
        assert published.is_set(), "a.wav was not written while the model ran b.wav"
        return halve(window)

    items.append(work(tmp_path, "b", 0.3, wait_for_a))
    assert all(isinstance(o, Finished) for o in run_all(items))


def test_the_reader_stays_a_few_windows_ahead(tmp_path, monkeypatch):
    """While the model holds its first window, the reader takes at most READ_AHEAD more (and one
    in hand waiting for room): host memory stays a few windows, however long the corpus."""
    read = []
    real_windows = conveyor.read_windows

    def counted(*args):
        for window in real_windows(*args):
            read.append(window[0])
            yield window

    monkeypatch.setattr(conveyor, "read_windows", counted)
    release = threading.Event()

    def first_waits(window):
        release.wait(0.5)
        return halve(window)

    items = [work(tmp_path, f"f{i}", 0.2, first_waits if i == 0 else halve, seed=i)
             for i in range(8)]
    seen = []

    def started(item):
        seen.append(len(read))

    run_all(items, on_start=started)
    assert seen[0] <= 1 + READ_AHEAD + 1, seen
    assert len(read) == 8


def test_an_interrupt_removes_what_was_half_written_and_gives_what_finished(tmp_path):
    """Ctrl-C from the third file's progress: no temporary file is left, the workers end, and
    stop() gives the outcomes finished meanwhile in order."""
    def interrupt_third(item):
        if item.plan.name.endswith("c.wav"):
            def progress(frames):
                raise KeyboardInterrupt
            return progress
        return None

    items = [work(tmp_path, name, 0.3, halve) for name in "abcd"]
    belt = Conveyor(items, on_start=interrupt_third)
    handed = []
    with belt:
        with pytest.raises(KeyboardInterrupt):
            for outcome in belt:
                handed.append(outcome)
        finished = handed + belt.stop()
    assert 0 < len(finished) <= 2 and all(isinstance(o, Finished) for o in finished)
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["a.wav", "b.wav"][:len(written)] and len(written) >= len(finished)
    assert no_temporaries(tmp_path)
    assert not [t for t in threading.enumerate() if t.name.startswith("speechlens-")]


def test_a_bug_in_a_worker_is_raised_not_waited_for(tmp_path, monkeypatch):
    """A failure that is not a file's (here the writer's join raising TypeError) reaches the
    caller, with no temporary file left and no thread waiting."""
    def broken(self, *args):
        raise TypeError("a bug")

    monkeypatch.setattr(conveyor.WindowJoiner, "add", broken)
    items = [work(tmp_path, name, 0.2, halve) for name in "abcdef"]
    with pytest.raises(TypeError, match="a bug"):
        run_all(items)
    assert no_temporaries(tmp_path)
    assert not [t for t in threading.enumerate() if t.name.startswith("speechlens-")]

