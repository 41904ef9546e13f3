"""The Python API the CLI is built on; its defaults are the CLI's defaults.

Load the model once and pass it to every call (each call given a path or None loads it again).
get_model() prepares the process (runtime.prepare: full float32, glibc's large-block settings);
on Linux the optimized BLAS is loaded only if that runs before MLX is imported, which importing
this module does, hence the first lines (or use the package's speechlens_cli.enhance, ...)::

    from speechlens_cli import runtime
    runtime.prepare()                       # before MLX is imported: runtime.restore() undoes it

    import soundfile as sf
    from speechlens_cli import api

    model = api.get_model()                 # nvidia/RE-USE, or get_model("path/to/checkpoint")
    for name in ("a.wav", "b.wav"):
        audio, rate = sf.read(name, dtype="float32")
        clean = api.enhance(audio, rate, model=model)
        api.enhance_file(name, f"clean-{name}", model=model)   # streamed, for long files

Below enhance_file, plan_file, run_plan and run_plans take each file's options as one
EnhanceOptions (its defaults are the CLI's); a run's results are results.FileResult.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from . import audio as audio_io
from . import checkpoint, runtime
from .audio import AudioInfo, OutputFormat
from .conveyor import Conveyor, Finished, Work
from .errors import (
    AudioInputError,
    EnhancementError,
    OutputError,
    OutputExistsError,
    SpeechlensError,
    UsageError,
)
from .model.config import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, SUPPORTED_SAMPLE_RATES, ModelConfig
from .model.semamba import SEMamba
from .pipeline import (
    DEFAULT_CHUNK_SECONDS,
    DEFAULT_DEVICE,
    DEFAULT_OVERLAP,
    DEVICES,
    Geometry,
    ProgressFn,
    Residual,
    check_atten_lim,
    check_settings,
    check_window_memory,
    mix_original,
    original_share,
    plan_windows,
)
from .results import AudioFacts, FileResult, Status

ModelSpec = SEMamba | str | os.PathLike | None


def get_model(model: ModelSpec = None) -> SEMamba:
    """An already-loaded model passes through; anything else is resolved and loaded (None:
    $SPEECHLENS_MODEL, else nvidia/RE-USE). Load once, pass the result to every call. The
    process is prepared first (runtime.prepare, once; runtime.opt_out declines it)."""
    runtime.prepare()
    return model if isinstance(model, SEMamba) else checkpoint.load_model(model)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) \
        and not isinstance(value, (bool, np.bool_))


def _is_path(value) -> bool:
    return isinstance(value, (str, os.PathLike))


#: What the API's arguments must be, by name: (what to say, the test). A wrong type is then a
#: UsageError naming the argument, not a TypeError from deep inside (or, for strict="no", a
#: silent yes).
_ARGUMENTS = {
    "source": ("a path (str or os.PathLike)", _is_path),
    "destination": ("a path (str or os.PathLike)", _is_path),
    "model": ("a loaded model, a checkpoint path or a repo id, or None",
              lambda v: v is None or isinstance(v, SEMamba) or _is_path(v)),
    "strict": ("True or False", lambda v: isinstance(v, (bool, np.bool_))),
    "overwrite": ("True or False", lambda v: isinstance(v, (bool, np.bool_))),
    "chunk_seconds": ("a number of seconds, or None", lambda v: v is None or _is_number(v)),
    "overlap": ("a number (a fraction of the window)", _is_number),
    "atten_lim_db": ("a number of decibels, or None", lambda v: v is None or _is_number(v)),
    "subtype": ("an encoding's name (str), or None", lambda v: v is None or isinstance(v, str)),
    "bit_rate": ("bits per second (an integer), or None",
                 lambda v: v is None or (_is_number(v) and float(v).is_integer())),
    "progress": ("a callable, or None", lambda v: v is None or callable(v)),
    "track": ("a track's number from 0 (an integer), or None",
              lambda v: v is None or (isinstance(v, (int, np.integer))
                                      and not isinstance(v, (bool, np.bool_)) and v >= 0)),
}


def _check_arguments(**arguments) -> None:
    for name, value in arguments.items():
        what, valid = _ARGUMENTS[name]
        if not valid(value):
            raise UsageError(f"{name} must be {what}, got {value!r:.80}")


@dataclass(frozen=True, kw_only=True)
class EnhanceOptions:
    """How each file of a run is enhanced and written: the one place of the API's and the CLI's
    defaults (`speechlens enhance`'s options take theirs from here). Checked when made: a value
    of the wrong type, or out of range, is a UsageError naming it."""

    #: A little slower; the same output on every kind of CPU, closest to a float64 run.
    strict: bool = False
    overwrite: bool = False   # replace an existing output
    #: Windows of this many seconds; None: each file whole up to MAX_WINDOW_SECONDS, longer
    #: ones in windows of it (pipeline.plan_windows).
    chunk_seconds: float | None = DEFAULT_CHUNK_SECONDS
    overlap: float = DEFAULT_OVERLAP   # the cross-fade between windows, a fraction of one
    subtype: str | None = None   # the output's encoding; None: the input's
    #: Keep some of the original: what is removed goes at most this many dB down
    #: (pipeline.mix_original); None: no limit.
    atten_lim_db: float | None = None
    #: A lossy output's, in bits per second; None: the input's for its own codec, else a
    #: speech rate.
    bit_rate: int | None = None
    track: int | None = None   # a media file's audio track, from 0; None: its default one

    def __post_init__(self) -> None:
        _check_arguments(**{item.name: getattr(self, item.name) for item in fields(self)})
        check_settings(self.chunk_seconds, self.overlap)
        check_atten_lim(self.atten_lim_db)
        if self.bit_rate is not None:
            audio_io.parse_bit_rate(str(self.bit_rate), "bit_rate")


#: Integer PCM the API takes, and the full scale each is divided by (soundfile's reading of
#: PCM_16 and PCM_32 as float: -32768 -> -1.0, 32767 -> 1 - 2**-15).
_PCM_FULL_SCALE = {np.dtype(np.int16): 2.0 ** 15, np.dtype(np.int32): 2.0 ** 31}


def _real_array(audio) -> np.ndarray:
    """`audio` as float samples in [-1, 1] full scale: floats as they are, int16 and int32 PCM
    scaled as soundfile reads them (taken as floats, they came out ~32,768 times too loud).
    Other integers have no agreed full scale, and complex, timedelta, boolean or object arrays
    no meaning as audio: each is refused."""
    try:
        array = np.asarray(audio)
    except (ValueError, TypeError) as error:   # ragged nesting, objects numpy cannot hold
        reason = str(error).splitlines()[0]
        raise UsageError(f"audio must be a 1-D or 2-D numeric array of real samples ({reason})") \
            from None
    if array.ndim not in (1, 2) or array.dtype.kind not in "iuf":
        raise UsageError(f"audio must be a 1-D or 2-D numeric array of real samples (integers "
                         f"or floats), got shape {array.shape} of {array.dtype}")
    if array.dtype.kind == "f":
        return array
    if array.dtype not in _PCM_FULL_SCALE:
        raise UsageError(f"audio of {array.dtype} has no full scale speechlens knows: give "
                         "floats in [-1, 1], or int16 or int32 PCM")
    return array / _PCM_FULL_SCALE[array.dtype]


def check_sample_rate(sample_rate: int, name: str | None = None) -> None:
    """`name`, when given, prefixes the message (the file the rate came from)."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)):
        raise UsageError(f"sample rate must be an integer number of Hz, got {sample_rate!r}")
    if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise AudioInputError(
            (f"{name}: " if name else "") + f"sample rate {sample_rate} Hz is not supported "
            f"(RE-USE runs at {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz)"
        )


def check_length(config: ModelConfig, frames: int, sample_rate: int, subject: str) -> None:
    """At least one STFT frame of audio; `subject` names it in the message."""
    minimum = config.stft_params(sample_rate).n_fft
    if frames < minimum:
        raise AudioInputError(f"{subject} too short ({frames} samples; one STFT frame needs "
                              f"{minimum} at {sample_rate} Hz)")


def enhance_channels(model: SEMamba, audio: np.ndarray, sample_rate: int,
                     strict: bool) -> np.ndarray:
    """[N, C] float32 -> [N, C] float32, every channel through the model on its own.

    A channel of digital silence (every sample exactly zero: a muted channel, padding) stays
    silent: the model is not run on it, so it cannot invent sound where there was none.
    """
    out = np.empty(audio.shape, dtype=np.float32)
    for channel in range(audio.shape[1]):
        if not audio[:, channel].any():
            out[:, channel] = 0.0
            continue
        signal = mx.array(np.ascontiguousarray(audio[:, channel], dtype=np.float32))[None]
        try:
            enhanced = model.enhance(signal, sample_rate, strict=strict)
            mx.eval(enhanced)
        except (RuntimeError, ValueError, MemoryError) as error:  # MLX: out of memory, kernels
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            hint = ("; shorter windows (--chunk-seconds) need less memory"
                    if _out_of_memory(error) else "")
            raise EnhancementError(f"the model failed on {len(signal[0])} samples at "
                                   f"{sample_rate} Hz ({reason}){hint}") from None
        out[:, channel] = np.asarray(enhanced[0])
    return out


def _out_of_memory(error: Exception) -> bool:
    """A failed allocation: Python's MemoryError, or MLX's words for one ("[malloc] Unable to
    allocate", Metal's "Insufficient Memory", CUDA's "out of memory"). Anything else is not
    fixed by shorter windows."""
    text = str(error).lower()
    return isinstance(error, MemoryError) or any(
        words in text for words in ("allocate", "out of memory", "insufficient memory"))


def window_enhancer(model: SEMamba, sample_rate: int, strict: bool, name: str):
    """enhance_channels for the windows of the file `name`, whose failures name it."""
    def enhance_window(window: np.ndarray) -> np.ndarray:
        try:
            return enhance_channels(model, window, sample_rate, strict)
        except EnhancementError as error:
            raise EnhancementError(f"{name}: {error}") from None
    return enhance_window


def enhance(
    audio: np.ndarray, sample_rate: int, *, model: ModelSpec = None, strict: bool = False,
    atten_lim_db: float | None = None,
) -> np.ndarray:
    """Enhance a whole in-memory signal.

    `audio` is [N] or [N, channels] (soundfile's layout), float in [-1, 1] full scale, or int16
    or int32 PCM (scaled to it as soundfile does); the result has the same shape, float32.
    Peaks above full scale are kept, never clipped or rescaled. `model`: one loaded once with
    get_model for many calls (the module's example), or what get_model takes, loaded here.
    `atten_lim_db` keeps some of the original (pipeline.mix_original).
    """
    _check_arguments(model=model, strict=strict, atten_lim_db=atten_lim_db)
    check_atten_lim(atten_lim_db)
    check_sample_rate(sample_rate)
    array = _real_array(audio)
    frames = array.shape[0]
    if array.ndim == 2:
        audio_io.check_channels(array.shape[1], "audio",
                                "a [channels, N] array needs transposing to [N, C]")
    audio_io.check_finite(array, "audio")
    net = get_model(model)
    check_length(net.config, frames, int(sample_rate), "audio is")
    check_window_memory(net.config, frames, int(sample_rate), "audio")
    as_channels = array.reshape(frames, -1).astype(np.float32)
    out = enhance_channels(net, as_channels, int(sample_rate), strict)
    if not np.isfinite(out).all():
        peak = float(np.abs(as_channels).max())
        raise AudioInputError(
            f"the model output NaN or Inf (the input peaks at {peak:.3g} times full scale)"
        )
    return mix_original(as_channels, out, original_share(atten_lim_db)).reshape(array.shape)


@dataclass(frozen=True)
class FilePlan:
    """One checked job: everything known about it before any model is loaded."""

    source: Path
    destination: Path
    info: AudioInfo
    output: OutputFormat
    overwrite: bool
    name: str
    root: Path | None = None  # the output folder named, when `destination` is mirrored below it
    residual: Residual | None = None  # where what is removed goes too (--residual)

    def facts(self) -> AudioFacts:
        """What a report shows about the file before and after enhancing it."""
        return AudioFacts(self.info.sample_rate, self.info.channels, self.info.frames,
                          round(self.info.seconds, 6), self.output.format, self.output.subtype)


def plan_file(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    options: EnhanceOptions | None = None,
    *,
    container: str | None = None,
    name: str | None = None,
    create_folders: bool = False,
    inputs: frozenset = frozenset(),
    root: str | os.PathLike | None = None,
) -> FilePlan:
    """Every check that needs no model: a readable input at a supported rate, an output that is
    not the input, does not exist (unless `options.overwrite`), lands in a writable folder and
    has a container that holds every stream copied from a media input.

    With `create_folders`, a missing output folder is fine when its nearest existing ancestor is
    writable (the batch mirrors the input tree into it). `options.track` picks a media file's
    audio track; any other file has none to pick, a usage error. `inputs`, every input of the
    run (audio_io.identities): an output among them is refused, as replacing it would lose it.
    `root`, the output folder named when `destination` is mirrored below it: no symbolic link
    between the two is followed.
    """
    options = options or EnhanceOptions()
    overwrite, track = options.overwrite, options.track
    source, destination = Path(source), Path(destination)
    root = destination.parent if root is None else Path(root)
    if not destination.is_relative_to(root):
        raise UsageError(f"{destination}: is not inside its output folder {root}")
    name = name or str(source)
    info = audio_io.read_info(source, name, track)
    check_sample_rate(info.sample_rate, name)
    if track is not None and info.media is None:
        raise UsageError(f"{name}: is a {info.format} file, not a media container: it has no "
                         "tracks to choose from (--track)")
    _check_destination(source, destination, root, inputs=inputs, overwrite=overwrite,
                       create_folders=create_folders)
    output = audio_io.output_format(info, destination, options.subtype, container=container,
                                    source=source, bit_rate=options.bit_rate)
    audio_io.check_copies_fit(info, output, str(destination))
    return FilePlan(source, destination, info, output, overwrite, name, root)


def plan_residual(plan: FilePlan, residual: str | os.PathLike,
                  options: EnhanceOptions | None = None, *, create_folders: bool = False,
                  inputs: frozenset = frozenset()) -> FilePlan:
    """`plan`, also writing what is removed (input minus output) to `residual`: checked as the
    output is, and written by the output's rules (its suffix decides the container; `options`'
    subtype, and bit rate where it is lossy, as the output's are)."""
    options = options or EnhanceOptions()
    subtype, bit_rate = options.subtype, options.bit_rate
    residual = Path(residual)
    if audio_io.same_file(residual, plan.destination) or residual == plan.destination:
        raise UsageError(f"{residual}: is the output itself; the residual needs its own name")
    beside = residual.parent == plan.destination.parent
    _check_destination(plan.source, residual, plan.root if beside else residual.parent,
                       inputs=inputs, overwrite=plan.overwrite,
                       create_folders=create_folders and beside)
    output = audio_io.output_format(plan.info, residual, subtype, source=plan.source)
    if bit_rate is not None and output.bit_rate is not None:
        output = audio_io.output_format(plan.info, residual, subtype, source=plan.source,
                                        bit_rate=bit_rate)
    audio_io.check_copies_fit(plan.info, output, str(residual))
    return replace(plan, residual=Residual(residual, output, str(residual)))


def _check_destination(source: Path, destination: Path, root: Path, *, inputs: frozenset,
                       overwrite: bool, create_folders: bool) -> None:
    """A file may be written at `destination`: a name the system takes, below `root` through no
    link, not an input, not a folder, new unless `overwrite`, in a writable folder."""
    problem = audio_io.name_problem(destination)
    if problem:
        raise OutputError(f"{destination}: {problem}")
    audio_io.check_no_links(root, destination.parent)
    if audio_io.same_file(source, destination):
        raise UsageError(f"{destination}: is the input itself; choose another output")
    if not inputs.isdisjoint(audio_io.identities(destination)):
        raise OutputError(f"{destination}: is also an input of this run; choose another output")
    if destination.is_dir():
        raise OutputError(f"{destination}: is a folder, not an output file")
    if destination.exists() and not overwrite:
        raise OutputExistsError(
            f"{destination}: already exists (use --overwrite to replace it or --skip-existing "
            "to keep it)"
        )
    folder = destination.parent
    audio_io.check_writable(audio_io.nearest_existing(folder) if create_folders else folder)


def check_plan(plan: FilePlan, config: ModelConfig,
               options: EnhanceOptions | None = None) -> Geometry:
    """The checks of a planned file that need the model's configuration, not its weights (long
    enough for one STFT frame, windows that fit in memory): run_plan's, and a dry run's."""
    options = options or EnhanceOptions()
    check_length(config, plan.info.frames, plan.info.sample_rate, f"{plan.name}:")
    return plan_windows(config, plan.info.frames, plan.info.sample_rate, options.chunk_seconds,
                        options.overlap, plan.name)


def untrained_rate_note(plan: FilePlan) -> str | None:
    """What happens to a file whose rate is above the 8-48 kHz RE-USE was trained on (up to
    MAX_SAMPLE_RATE it runs, its STFT scaled to the rate), or None within that range."""
    rate, top = plan.info.sample_rate, max(SUPPORTED_SAMPLE_RATES)
    if rate <= top:
        return None
    return (f"{plan.name}: {rate} Hz is above the {MIN_SAMPLE_RATE // 1000}-{top // 1000} kHz "
            f"RE-USE was trained on; it is enhanced at {rate} Hz all the same and may come out "
            f"less clean (resample to {top} Hz for the model's own range)")


def run_plans(
    items: Iterable,
    model: SEMamba,
    options: EnhanceOptions | None = None,
    *,
    on_start: Callable[[FilePlan], ProgressFn | None] | None = None,
    after: Callable[[FilePlan, FileResult], FileResult] | None = None,
) -> Conveyor:
    """Every FilePlan among `items` through `model` as `options` say, reading the next files
    and writing the finished ones beside the model (conveyor.Conveyor, to use in a `with`
    block); anything else passes through. Iterating gives one outcome per item, in order: a
    FilePlan's FileResult or the SpeechlensError that failed it alone, any other item as it is.
    `on_start(plan)`, as a file's first window reaches the model, may return its progress
    callback; `after(plan, result)`, once the file is published, gives the result reported, on
    the writer's thread beside the model (scores; its SpeechlensError fails the file, whose
    output stays)."""
    options = options or EnhanceOptions()
    works = []
    for item in items:
        if isinstance(item, FilePlan):
            try:
                geometry = check_plan(item, model.config, options)
            except SpeechlensError as error:
                item = error
            else:
                item = Work(item, geometry,
                            window_enhancer(model, item.info.sample_rate, options.strict,
                                            item.name), options.atten_lim_db)
        works.append(item)

    def finish(work: Work, finished: Finished) -> FileResult:
        result = _done(work, finished)
        return result if after is None else after(work.plan, result)

    return Conveyor(works, on_start=on_start and (lambda work: on_start(work.plan)),
                    finish=finish)


def _done(work: Work, finished: Finished) -> FileResult:
    plan, stream = work.plan, finished.stream
    return FileResult(
        plan.name, str(plan.destination), Status.DONE,
        audio=replace(plan.facts(), frames=stream.frames), windows=stream.windows,
        clamped=stream.clamped, elapsed_seconds=round(finished.elapsed_seconds, 3),
        residual=str(plan.residual.destination) if plan.residual else None)


def run_plan(plan: FilePlan, model: SEMamba, options: EnhanceOptions | None = None, *,
             progress: ProgressFn | None = None) -> FileResult:
    """Stream one planned file through `model` into a temporary file, then rename it into place
    (run_plans for one file: its next windows read, and its finished ones written, beside the
    model)."""
    with run_plans([plan], model, options, on_start=lambda _: progress) as runs:
        (outcome,) = runs
    if isinstance(outcome, SpeechlensError):
        raise outcome
    return outcome


def enhance_file(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    *,
    model: ModelSpec = None,
    strict: bool = EnhanceOptions.strict,
    overwrite: bool = EnhanceOptions.overwrite,
    chunk_seconds: float | None = EnhanceOptions.chunk_seconds,
    overlap: float = EnhanceOptions.overlap,
    subtype: str | None = EnhanceOptions.subtype,
    progress: ProgressFn | None = None,
    atten_lim_db: float | None = EnhanceOptions.atten_lim_db,
    bit_rate: int | None = EnhanceOptions.bit_rate,
) -> dict:
    """Enhance one audio file into another, streaming: same rate, channels, length and format.

    Checks the input and the destination before the model is loaded. Returns what the CLI's
    `--json` prints for the file; `clamped` counts samples an integer format had to clamp.
    `atten_lim_db` keeps some of the original (pipeline.mix_original); `bit_rate`, a lossy
    output's in bits per second (default: the input's for its own codec, else a speech rate).
    The keywords are EnhanceOptions' (its defaults); plan_file and run_plan take one whole.
    """
    _check_arguments(source=source, destination=destination, model=model, progress=progress)
    options = EnhanceOptions(strict=strict, overwrite=overwrite, chunk_seconds=chunk_seconds,
                             overlap=overlap, subtype=subtype, atten_lim_db=atten_lim_db,
                             bit_rate=bit_rate)
    plan = plan_file(source, destination, options)
    return run_plan(plan, get_model(model), options, progress=progress).as_dict()


def select_device(name: str = DEFAULT_DEVICE) -> str:
    """Make `name` (auto, gpu or cpu) MLX's default device; returns the device chosen."""
    if name not in DEVICES:
        raise UsageError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    has_gpu = runtime.gpu_backend() is not None
    if name == "gpu" and not has_gpu:
        raise UsageError(
            "no GPU in this MLX build (Metal needs Apple silicon, CUDA needs "
            "pip install 'speechlens[cuda]'); use --device cpu"
        )
    return runtime.use("gpu" if name == "gpu" or (name == "auto" and has_gpu) else "cpu").device
