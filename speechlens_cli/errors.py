"""Typed failures. The CLI maps each to one line and an exit code in one place (cli/app.py)."""

from __future__ import annotations

from collections.abc import Callable


class SpeechlensError(Exception):
    """Base class: a failure we can explain to the user in one line."""

    exit_code = 1


class UsageError(SpeechlensError):
    """The command line or API call asked for something impossible."""

    exit_code = 2


class LicenseRequiredError(UsageError):
    """NVIDIA's weights would be downloaded, but their license has not been accepted."""


class ModelNotFoundError(SpeechlensError):
    """No checkpoint at the given path, or not cached and not downloadable."""


class CheckpointFormatError(SpeechlensError):
    """The checkpoint file is truncated, not safetensors, or otherwise unreadable."""


class IncompatibleModelError(SpeechlensError):
    """The checkpoint reads fine but does not match the RE-USE architecture."""


class ChecksumMismatchError(SpeechlensError):
    """A downloaded or cached file does not have the pinned sha256."""


class AudioInputError(SpeechlensError):
    """The input audio cannot be enhanced (unreadable, empty, bad rate, NaN, too short)."""


class EnhancementError(SpeechlensError):
    """The model itself failed on an input (e.g. the accelerator ran out of memory)."""


class OutputError(SpeechlensError):
    """The output cannot be written where asked."""


class OutputExistsError(OutputError):
    """The output already exists (found at planning, or created meanwhile by another process)."""


class MissingExtraError(SpeechlensError):
    """An optional extra a command needs (scoring: `report`) is not installed, or is broken."""


class BatchFailedError(SpeechlensError):
    """A batch ran to the end but some files failed; the summary lists them."""

    exit_code = 3


class GroupExit(SpeechlensError):
    """Every rank of a launcher's group leaves together, with the code all of them decided from
    the same gathered data (0: all done). Only the rank that `speaks` (rank 0) prints `message`
    (None: nothing to say); then all meet at `barrier` and leave at once, because mlx.launch
    terminates the remaining ranks as soon as one exits non-zero, and nothing may still be
    printing by then."""

    def __init__(self, code: int, message: str | None, *, speaks: bool,
                 barrier: Callable[[], None]):
        super().__init__(message or "")
        self.exit_code, self.message, self.speaks, self.barrier = code, message, speaks, barrier
