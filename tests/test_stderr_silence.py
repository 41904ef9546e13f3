"""audio.libsndfile.native_stderr_silenced across threads: a batch reads ahead of the model,
and writes and scores behind it; fd 2 is the process's, so threads inside at once share one
silence and the last one out gives it back. The silence covers only what libmpg123 prints
(probing unknown bytes, decoding MPEG): a WAV or FLAC read or read back on a worker thread
leaves fd 2 alone, and another thread's lines meanwhile arrive."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile as sf

from speechlens_cli.audio import (
    AudioInfo,
    OutputFormat,
    open_reader,
    open_sink,
    read_block,
    read_info,
)
from speechlens_cli.audio.libsndfile import native_stderr_silenced
from speechlens_cli.audio.write import sink
from speechlens_cli.errors import AudioInputError


def _identity(fd: int) -> tuple[int, int, int]:
    found = os.fstat(fd)
    return found.st_dev, found.st_ino, found.st_rdev


def test_overlapping_threads_give_fd_2_back_when_the_last_one_leaves():
    """A in, B in, A out, B out: before, each restored what it had saved, and B had saved
    /dev/null: fd 2 stayed silent for good (every later message lost)."""
    quiet = os.open(os.devnull, os.O_WRONLY)
    before, silent = _identity(2), _identity(quiet)
    os.close(quiet)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first() -> None:
        with native_stderr_silenced():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def second() -> None:
        a_in.wait(10)
        with native_stderr_silenced():
            b_in.set()
            a_out.wait(10)
            seen["after A left"] = _identity(2)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert seen["after A left"] == silent   # still silent while B is inside
    assert _identity(2) == before


def test_the_clis_messages_are_not_silenced_with_fd_2(tmp_path):
    """A process of the CLI prints through its own descriptor: a line written while a reader
    thread has fd 2 silenced still arrives (before, it went to /dev/null)."""
    script = (
        "import sys\n"
        "from speechlens_cli.audio.libsndfile import native_stderr_silenced\n"
        "from speechlens_cli.cli import app\n"
        "app._stderr_of_its_own()\n"
        "with native_stderr_silenced():\n"
        "    print('kept while fd 2 is silent', file=sys.stderr)\n"
        "    import os; os.write(2, b'native noise')\n"
        "print('kept after', file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stderr.splitlines() == ["kept while fd 2 is silent", "kept after"]


@contextlib.contextmanager
def _fd_2_into(path: Path) -> Iterator[None]:
    """Fd 2 pointed at the file `path` meanwhile, as a user's terminal or log would be."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _worker_while_lines_are_written(work, pause: list) -> list[str]:
    """Run `work` on a worker thread; each time it calls pause[0]() (from inside a libsndfile
    call), this thread writes a line to fd 2 and lets it go on. The lines fd 2 received."""
    inside, written, said = threading.Semaphore(0), threading.Semaphore(0), []

    def hold() -> None:
        inside.release()
        written.acquire(timeout=20)

    pause.append(hold)
    failure = []

    def run() -> None:
        try:
            work()
        except BaseException as error:   # reported below
            failure.append(error)
        finally:
            inside.release()

    worker = threading.Thread(target=run)
    worker.start()
    while worker.is_alive():
        if not inside.acquire(timeout=20) or not worker.is_alive():
            break
        said.append(f"line {len(said)} while the worker is inside libsndfile")
        os.write(2, (said[-1] + "\n").encode())
        written.release()
    worker.join(20)
    assert not failure, failure
    return said


def test_lines_on_fd_2_are_kept_while_a_worker_reads_a_wav(tmp_path, monkeypatch):
    """The conveyor's reader thread opens and reads a WAV while the main thread (an API user's
    code, the CLI) writes to fd 2: every line arrives. Before, every block read pointed fd 2 at
    /dev/null (for libmpg123, which only an MPEG encoding reaches), and such a line was lost."""
    wav = tmp_path / "speech.wav"
    sf.write(wav, np.zeros((3 * 4096, 2), np.float32), 16000)
    info = read_info(wav)
    pause, read = [], sf.SoundFile.read

    def read_holding(self, *args, **kwargs):
        pause[0]()
        return read(self, *args, **kwargs)

    monkeypatch.setattr(sf.SoundFile, "read", read_holding)

    def work() -> None:
        with open_reader(wav, "speech.wav", info) as (handle, _):
            for start in range(0, info.frames, 4096):
                read_block(handle, 4096, "speech.wav", start, info.frames)

    with _fd_2_into(tmp_path / "stderr"):
        said = _worker_while_lines_are_written(work, pause)
    assert len(said) == 3
    assert (tmp_path / "stderr").read_text().splitlines() == said


def test_lines_on_fd_2_are_kept_while_a_worker_reads_an_output_back(tmp_path, monkeypatch):
    """The conveyor's writer thread reads each finished FLAC back before publishing it: a line
    the main thread writes meanwhile arrives."""
    flac = tmp_path / "out.flac"
    info = AudioInfo(4096, 16000, 1, "FLAC", "PCM_16")
    pause, count = [], sink.count_decoded

    def count_holding(*args):
        pause[0]()
        return count(*args)

    monkeypatch.setattr(sink, "count_decoded", count_holding)

    def work() -> None:
        writer = open_sink(flac, info, OutputFormat("FLAC", "PCM_16"), "out.flac")
        writer.write(np.zeros((4096, 1), np.float32))
        writer.close()
        writer.verify()

    with _fd_2_into(tmp_path / "stderr"):
        said = _worker_while_lines_are_written(work, pause)
    assert len(said) == 1
    assert (tmp_path / "stderr").read_text().splitlines() == said


def _mpeg_in_wav(path: Path) -> None:
    """A WAV holding MPEG Layer III (format tag 0x55), which libsndfile decodes with libmpg123,
    damaged in the middle."""
    import av
    tone = 0.3 * np.sin(np.linspace(0, 2 * np.pi * 1320, 48000, dtype=np.float32))
    with av.open(str(path), "w", format="wav") as out:
        stream = out.add_stream("libmp3lame", rate=16000, layout="mono")
        frame = av.AudioFrame.from_ndarray(tone[None, :], format="fltp", layout="mono")
        frame.sample_rate, frame.pts = 16000, 0
        out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    data = bytearray(path.read_bytes())
    data[3000:5000] = np.random.default_rng(1).integers(0, 256, 2000, np.uint8).tobytes()
    path.write_bytes(bytes(data))


def test_what_libmpg123_prints_still_never_reaches_fd_2(tmp_path):
    """The two places native output is still silenced, because it is printed there: probing
    bytes that look like MPEG frames (libsndfile's MPEG detection warns "Cannot read next
    header"), and decoding a damaged MPEG stream inside a WAV (resync notes)."""
    junk, damaged = tmp_path / "junk.bin", tmp_path / "mpeg.wav"
    junk.write_bytes(b"\xff\xfb\x90\x00" * 3000)
    _mpeg_in_wav(damaged)
    with _fd_2_into(tmp_path / "stderr"):
        with contextlib.suppress(AudioInputError):
            read_info(junk)
        info = read_info(damaged)
        assert info.subtype == "MPEG_LAYER_III"
        with contextlib.suppress(AudioInputError), \
                open_reader(damaged, "mpeg.wav", info) as (handle, _):
            read_block(handle, info.frames, "mpeg.wav", 0, info.frames)
    assert (tmp_path / "stderr").read_bytes() == b""
