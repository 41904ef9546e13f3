"""audio.libsndfile.native_stderr_silenced across threads: a batch reads ahead of the model,
and writes and scores behind it, each read keeping libmpg123 off fd 2; fd 2 is the process's,
so threads inside at once share one silence and the last one out gives it back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from speechlens_cli.audio.libsndfile import native_stderr_silenced


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
