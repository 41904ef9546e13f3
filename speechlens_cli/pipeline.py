"""Streaming enhancement: read blocks, run fixed-length windows, cross-fade, write as they finish
(the file reading and writing themselves are in ``speechlens_cli.audio``).

Memory depends on the window length, never on the file length: the input is read a window at a
time, each window is evaluated before the next is built, and only the cross-fade tail of the
previous window is carried over. Every window except in files shorter than one window has the
same length (the last one is aligned to the end of the file), so MLX reuses the same buffers.

The defaults and limits here are the single source for the CLI and the Python API.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from . import kernels, runtime
from .audio import AudioInfo, OutputFormat, open_reader, open_sink, read_block
from .errors import AudioInputError, EnhancementError, UsageError
from .model.config import ModelConfig

#: No forced window length: each file gets the longest windows the memory budget allows, up to
#: MAX_WINDOW_SECONDS (plan_windows).
DEFAULT_CHUNK_SECONDS: float | None = None
CHUNK_SECONDS_RANGE = (5.0, 30.0)
#: A file up to this long that the memory budget holds runs as one window, as NVIDIA's scripts
#: run every file: no cross-fade work (a 6-s file in 5-s windows cost 1.7 times the model work
#: of one window), and the output is the whole-file result. Longer files run in windows of this
#: length, the longest measured (30 s at 48 kHz: 3.3 GB on an H200, 8.7 GB on a CPU).
MAX_WINDOW_SECONDS = CHUNK_SECONDS_RANGE[1]
DEFAULT_OVERLAP = 0.05
OVERLAP_RANGE = (0.0, 0.5)
DEVICES = ("auto", "gpu", "cpu")
DEFAULT_DEVICE = "auto"
#: Freed MLX buffers kept for reuse. Windows all have one length, so a small pool is enough.
CACHE_LIMIT_BYTES = 256 * 1024 * 1024

#: What a window costs while the model runs: MLX's peak (CPU, mx.get_peak_memory) grows by 6.1
#: to 7.5 times frames x bins x channels x 4 bytes (tiny and full-size configs, 0.5-2 s at 8 and
#: 16 kHz) above the weights, which the model holds twice (the checkpoint's and the
#: two-direction copies its BiMambas derive, ~68 d^2 floats per TF block each: 72 MiB measured
#: for the full-size model). 8 times the cells, the weights and 16 MiB leave room where the
#: CPU library's direct convolutions run; elsewhere the dense layers' time tiles (inputs and
#: taps) come on top, which 128 MiB covered (measured before the direct convolutions).
_BYTES_PER_CELL = 8 * 4
_FIXED_BYTES = {"direct": 16 << 20, "tiled": 128 << 20}


def _weight_bytes(cfg: ModelConfig) -> int:
    return 2 * 68 * cfg.hid_feature ** 2 * cfg.num_tfmamba * 4

WindowFn = Callable[[np.ndarray], np.ndarray]
ProgressFn = Callable[[int], None]


@dataclass(frozen=True)
class Geometry:
    """Window length and cross-fade length, in samples."""

    chunk: int
    overlap: int

    def __post_init__(self) -> None:
        if self.chunk < 1 or not 0 <= self.overlap <= self.chunk // 2:
            raise UsageError(
                f"window of {self.chunk} samples with {self.overlap} overlap: need a window of at "
                "least 1 sample and an overlap of at most half of it"
            )

    @classmethod
    def from_seconds(cls, chunk_seconds: float, overlap: float, sample_rate: int) -> Geometry:
        """Seconds and a fraction of the window -> samples (NVIDIA's int(portion * chunk))."""
        chunk = max(1, round(chunk_seconds * sample_rate))
        return cls(chunk, int(overlap * chunk))

    @property
    def hop(self) -> int:
        return self.chunk - self.overlap

    def settled(self, end: int, frames: int) -> int:
        """Where the output of a window ending at `end` stops being changed by the next one:
        `overlap` before its end, or the end of a file of `frames` for the last window."""
        return end if end == frames else end - self.overlap

    def starts(self, frames: int) -> list[int]:
        """Window starts: every hop while a window ends before the file does, then one ending
        at it."""
        starts = list(range(0, max(frames - self.chunk, 0), self.hop))
        starts.append(max(frames - self.chunk, 0))
        return starts


def check_settings(chunk_seconds: float | None, overlap: float) -> None:
    """The CLI's and the API's accepted window geometry (chunk_seconds None: plan_windows')."""
    low, high = CHUNK_SECONDS_RANGE
    if chunk_seconds is not None and not low <= chunk_seconds <= high:
        raise UsageError(f"chunk length {chunk_seconds:g} s is outside {low:g}-{high:g} s")
    low, high = OVERLAP_RANGE
    if not low <= overlap <= high:
        raise UsageError(f"overlap {overlap:g} is outside {low:g}-{high:g} of the window")


def window_bytes(cfg: ModelConfig, samples: int, sample_rate: int) -> int:
    """About the most memory the model takes for one channel of a window of `samples`."""
    stft = cfg.stft_params(sample_rate)
    frames = samples // stft.hop + 1
    direct = runtime.current().backend == "cpu" and kernels.cpu_library() is not None
    return (_FIXED_BYTES["direct" if direct else "tiled"] + _weight_bytes(cfg)
            + _BYTES_PER_CELL * frames * stft.n_bins * cfg.hid_feature)


#: Where the system's files are read from (tests point them at a fake tree).
PROC = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: What the process takes around the model, beyond MLX's peak, when its first window runs:
#: each thread that allocates gets its own glibc heap (64 MiB of address space reserved),
#: OpenBLAS its buffers, libraries load on first use. Measured at 8 kHz on 2 cores (5-s windows
#: of the tiny model, the least limit under which the run succeeds): 130 MiB of address space
#: and 114 MiB of data beyond window_bytes; 64 MiB per core and 64 MiB more cover both.
_HEAP_PER_CORE_BYTES = 64 << 20


def available_bytes() -> int | None:
    """Memory this process may still take: the least of the system's available memory, the
    room left in its container (cgroup v2 or v1) and under its own limits (RLIMIT_AS and
    RLIMIT_DATA, `ulimit -v` and `-d`); on macOS, the share of physical memory the kernel counts
    as available. None where nothing can be read."""
    if sys.platform == "darwin":
        return _macos_available_bytes()
    found = [room for room in (_meminfo_available(), *_cgroup_rooms(), *_rlimit_rooms())
             if room is not None]
    if not found:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return min(found) if found else None


def _meminfo_available() -> int | None:
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open(PROC / "meminfo") as meminfo:
            line = next(line for line in meminfo if line.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    return None


def _cgroup_rooms() -> list[int]:
    """Limit less usage of each memory cgroup from this process's own up to the root of the
    mount (a parent's limit holds too; a container may see its own cgroup as the root). Page
    cache the kernel can drop (inactive files) does not count as used."""
    rooms = []
    try:
        membership = (PROC / "self" / "cgroup").read_text().splitlines()
    except OSError:
        membership = ["0::/"]
    for line in membership:
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not controllers:
            base, files = CGROUP_ROOT, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base = CGROUP_ROOT / "memory"
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        parts = [part for part in path.split("/") if part not in ("", ".", "..")]
        for depth in range(len(parts), -1, -1):
            room = _cgroup_room(base.joinpath(*parts[:depth]), *files)
            if room is not None:
                rooms.append(room)
    return rooms


def _cgroup_room(folder: Path, limit_file: str, usage_file: str, inactive: str) -> int | None:
    try:
        limit = int((folder / limit_file).read_text())   # v2's "max": no limit, ValueError
        used = int((folder / usage_file).read_text())
    except (OSError, ValueError):
        return None
    with contextlib.suppress(OSError, ValueError):
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive:
                used -= int(value)
    return limit - used


def _rlimit_rooms() -> list[int]:
    """Room under the soft RLIMIT_AS and RLIMIT_DATA: the limit less what the process maps
    already (/proc/self/status: VmSize, VmData) and less what its threads take on the first
    window. An allocation past either limit does not fail in MLX's CPU backend: the process
    dies (SIGSEGV)."""
    try:
        status = (PROC / "self" / "status").read_text()
    except OSError:
        return []
    mapped = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        with contextlib.suppress(ValueError, IndexError):
            mapped[key] = int(value.split()[0]) * 1024
    around = _HEAP_PER_CORE_BYTES * (kernels.usable_cores() + 1)
    rooms = []
    for limit, field in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        soft, _ = resource.getrlimit(limit)
        if soft != resource.RLIM_INFINITY and field in mapped:
            rooms.append(soft - mapped[field] - around)
    return rooms


def _macos_available_bytes() -> int | None:
    """Physical memory times the share of it macOS counts as available (kern.memorystatus_level,
    the free percentage `memory_pressure` reports: free, inactive and purgeable pages)."""
    total, level = _sysctl("hw.memsize"), _sysctl("kern.memorystatus_level")
    if total is None or level is None:
        return None
    return total * level // 100


def _sysctl(name: str) -> int | None:
    """An integer sysctl of macOS (sysctlbyname), None where it cannot be read."""
    import ctypes.util  # here: it imports subprocess and more, which only macOS needs

    try:
        sysctlbyname = ctypes.CDLL(ctypes.util.find_library("c")).sysctlbyname
    except (OSError, AttributeError):
        return None
    sysctlbyname.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                             ctypes.c_void_p, ctypes.c_size_t]
    value, size = ctypes.c_uint64(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_uint64))
    if sysctlbyname(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return None
    return value.value   # a 4-byte int fills the low half (Macs are little-endian)


def _host_memory_budget() -> int | None:
    """What a window may take where the model runs in host memory (the CPU, Apple's unified
    memory); None elsewhere (a CUDA GPU's own memory) or where nothing can be read."""
    if not runtime.current().host_memory:
        return None
    return available_bytes()


def check_window_memory(cfg: ModelConfig, samples: int, sample_rate: int, name: str) -> None:
    """Refuse, before MLX allocates, a window the machine cannot hold: the CPU backend does not
    fail an allocation, it dies of it (SIGSEGV, exit 139, the temporary output left). The
    check applies where the model runs in host memory (the CPU, Apple's unified memory)."""
    _refuse_window(cfg, samples, sample_rate, name, _host_memory_budget())


def _refuse_window(cfg: ModelConfig, samples: int, sample_rate: int, name: str,
                   have: int | None) -> None:
    """check_window_memory's refusal against a budget read already (`have`; None: no bound)."""
    need = window_bytes(cfg, samples, sample_rate)
    if have is not None and need > have:
        raise EnhancementError(
            f"{name}: a window of {samples / sample_rate:g} s at {sample_rate} Hz needs about "
            f"{_size(need)} with this model, and {_size(max(have, 0))} is available: use "
            "shorter windows (--chunk-seconds) or free memory")


def plan_windows(cfg: ModelConfig, frames: int, sample_rate: int, chunk_seconds: float | None,
                 overlap: float, name: str) -> Geometry:
    """The windows of a file of `frames`. A forced `chunk_seconds` is taken as it is. Without
    one, a file of at most MAX_WINDOW_SECONDS runs as one window, and a longer one in windows of
    that length, each shortened where the memory budget (check_window_memory's) holds less,
    down to the shortest window allowed; a window that does not fit then is refused as
    check_window_memory refuses it. The budget is read once, for both."""
    room = _host_memory_budget()
    if chunk_seconds is None:
        longest = min(frames, round(MAX_WINDOW_SECONDS * sample_rate))
        shortest = min(frames, round(CHUNK_SECONDS_RANGE[0] * sample_rate))
        if room is not None and window_bytes(cfg, longest, sample_rate) > room:
            longest = _longest_fitting(cfg, sample_rate, shortest, longest, room)
        geometry = (Geometry(frames, 0) if longest == frames
                    else Geometry(longest, int(overlap * longest)))
    else:
        geometry = Geometry.from_seconds(chunk_seconds, overlap, sample_rate)
    _refuse_window(cfg, min(geometry.chunk, frames), sample_rate, name, room)
    return geometry


def _longest_fitting(cfg: ModelConfig, sample_rate: int, low: int, high: int, room: int) -> int:
    """The longest window in [low, high] samples whose window_bytes fit `room` (low if none)."""
    while low < high:
        middle = (low + high + 1) // 2
        if window_bytes(cfg, middle, sample_rate) <= room:
            low = middle
        else:
            high = middle - 1
    return low


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def check_atten_lim(atten_lim_db: float | None) -> None:
    """The CLI's and the API's accepted attenuation limit: None (no limit) or 0 dB and up."""
    if atten_lim_db is not None and not atten_lim_db >= 0:
        raise UsageError(f"attenuation limit {atten_lim_db:g} dB: give 0 dB (the input "
                         "unchanged) or more, inf for no limit")


def original_share(atten_lim_db: float | None) -> float:
    """The share g = 10^(-L/20) of the original mixed back under an attenuation limit of L dB
    (0 for no limit)."""
    return 0.0 if atten_lim_db is None else 10.0 ** (-atten_lim_db / 20.0)


def mix_original(original: np.ndarray, enhanced: np.ndarray, share: float) -> np.ndarray:
    """g * original + (1 - g) * enhanced: whatever the model removes from the original stays at
    g of its level, L dB down at most; g = 1 (0 dB) is the original exactly, g = 0 the
    enhanced audio exactly."""
    if share == 0.0:
        return enhanced
    return (np.float32(share) * original + np.float32(1.0 - share) * enhanced).astype(np.float32)


def crossfade_weights(length: int) -> tuple[np.ndarray, np.ndarray]:
    """sin^2 fade-in and cos^2 fade-out over `length` samples, as [length, 1] float64."""
    t = (np.arange(length, dtype=np.float64) + 0.5) / max(length, 1)
    fade_in = np.sin(0.5 * math.pi * t) ** 2
    return fade_in[:, None], (1.0 - fade_in)[:, None]


@contextlib.contextmanager
def bounded_cache(limit: int = CACHE_LIMIT_BYTES) -> Iterator[None]:
    """Cap MLX's buffer cache for the duration of a run, then restore the caller's limit."""
    previous = mx.set_cache_limit(limit)
    try:
        yield
    finally:
        mx.set_cache_limit(previous)
        mx.clear_cache()


@dataclass(frozen=True)
class StreamResult:
    frames: int
    windows: int
    clamped: int


class _WindowReader:
    """Hands out windows in increasing order while holding at most one window of input."""

    def __init__(self, handle, frames: int, name: str):
        self.handle, self.frames, self.name = handle, frames, name
        self.buffer = np.zeros((0, handle.channels), np.float32)
        self.origin = 0  # file position of buffer[0]

    def window(self, start: int, end: int) -> np.ndarray:
        self.buffer = self.buffer[max(start - self.origin, 0):]
        self.origin = max(start, self.origin)
        missing = end - (self.origin + len(self.buffer))
        if missing > 0:
            block = read_block(self.handle, missing, self.name, self.origin + len(self.buffer),
                               self.frames)
            self.buffer = np.concatenate([self.buffer, block]) if len(self.buffer) else block
        return self.buffer[start - self.origin:end - self.origin]


def read_windows(handle, info: AudioInfo, geometry: Geometry,
                 name: str) -> Iterator[tuple[int, int, np.ndarray]]:
    """(start, end, samples) of every window of the open file `handle`, in order. A window is
    never changed after it is handed out (the reader's buffer is replaced, not written into),
    so it may be kept while the next ones are read."""
    reader = _WindowReader(handle, info.frames, name)
    for start in geometry.starts(info.frames):
        end = min(start + geometry.chunk, info.frames)
        yield start, end, reader.window(start, end)


def checked_output(window: np.ndarray, enhanced: np.ndarray, start: int, sample_rate: int,
                   name: str) -> np.ndarray:
    """`enhanced`, unless the model turned the window into NaN or Inf (finite input far beyond
    full scale overflows the STFT): that stops the file, never reaching its output."""
    if not np.isfinite(enhanced).all():
        raise AudioInputError(
            f"{name}: the model output NaN or Inf for the window at {start / sample_rate:.2f} s "
            f"(the input peaks at {float(np.abs(window).max()):.3g} times full scale there)"
        )
    return enhanced


@dataclass(frozen=True)
class Residual:
    """Where enhance_stream writes what it removed: a (temporary) file, its format (the output's
    rules), and its name in messages."""

    destination: Path
    output: OutputFormat
    name: str


class WindowJoiner:
    """The writing side of a file's windows: each enhanced window mixed with its input under an
    attenuation limit, cross-faded with the one before, and every block written once it is
    final (and the input less it to the residual, sample for sample aligned).

    Where windows overlap, the earlier one fades out (cos^2) as the later one fades in (sin^2),
    divided by the summed weight; elsewhere each output sample comes from exactly one window.
    The mix comes before the cross-fade, which is linear, so the limit holds across window
    boundaries too. Only the cross-fade tail of the previous window is kept."""

    def __init__(self, destination: str | Path, info: AudioInfo, output: OutputFormat,
                 shown: str, *, residual: Residual | None = None,
                 atten_lim_db: float | None = None, progress: ProgressFn | None = None):
        self.frames, self.share, self.progress = info.frames, original_share(atten_lim_db), progress
        self.sink = open_sink(destination, info, output, shown)
        self.removed = None
        if residual is not None:
            try:
                self.removed = open_sink(residual.destination, info, residual.output,
                                         residual.name)
            except BaseException:
                self.sink.abandon()
                raise
        self.tail = np.zeros((0, info.channels), np.float32)  # previous window's cross-fade
        self.windows = 0

    def add(self, start: int, end: int, geometry: Geometry, window: np.ndarray,
            enhanced: np.ndarray) -> None:
        """The window [start, end) of the input, cut by `geometry`, and the model's output
        for it."""
        enhanced = mix_original(window, enhanced, self.share)
        written = self.sink.written
        if len(self.tail):
            fade_in, fade_out = crossfade_weights(len(self.tail))
            head = enhanced[written - start:written - start + len(self.tail)]
            mixed = (self.tail * fade_out + head * fade_in) / (fade_out + fade_in)
            self._emit(mixed.astype(np.float32), window, start)
        final = geometry.settled(end, self.frames)
        self._emit(enhanced[self.sink.written - start:final - start], window, start)
        self.tail = enhanced[final - start:]
        self.windows += 1

    def _emit(self, block: np.ndarray, window: np.ndarray, start: int) -> None:
        if self.removed is not None:   # the input under this block: inside the current window
            offset = self.sink.written - start
            self.removed.write(window[offset:offset + len(block)] - block)
        self.sink.write(block)
        if self.progress is not None:
            self.progress(self.sink.written)

    def close(self) -> StreamResult:
        """Close the outputs and read each back whole (their failures are OutputErrors)."""
        self.sink.close()
        if self.removed is not None:
            self.removed.close()
        self.sink.verify()
        if self.removed is not None:
            self.removed.verify()
        return StreamResult(self.sink.written, self.windows, self.sink.clamped)

    def abandon(self) -> None:
        """Stop writing: what was written is left to the caller's temporary files to remove."""
        self.sink.abandon()
        if self.removed is not None:
            self.removed.abandon()


def enhance_stream(
    source: str | Path,
    destination: str | Path,
    enhance_window: WindowFn,
    geometry: Geometry,
    output: OutputFormat,
    *,
    name: str | None = None,
    progress: ProgressFn | None = None,
    output_name: str | None = None,
    info: AudioInfo | None = None,
    atten_lim_db: float | None = None,
    residual: Residual | None = None,
) -> StreamResult:
    """Enhance `source` into `destination` window by window on this thread, writing each block
    once it is final (WindowJoiner). The conveyor runs the same steps with reading and writing
    on threads of their own.

    `enhance_window` maps float32 [n, channels] to the enhanced [n, channels] (evaluated). The
    last window ends at the end of the file, so every window but that of a file shorter than
    one window has the full length. `output_name` names the output in error messages
    (`destination` may be a temporary name); `info`, the input's (from planning), spares
    reading it again. `atten_lim_db`: pipeline.mix_original. `residual`: also write what was
    removed. The closed output is read back before returning.
    """
    name = name or str(source)
    with open_reader(source, name, info) as (handle, info), bounded_cache():
        joiner = WindowJoiner(destination, info, output, output_name or str(destination),
                              residual=residual, atten_lim_db=atten_lim_db, progress=progress)
        try:
            for start, end, window in read_windows(handle, info, geometry, name):
                enhanced = checked_output(window, enhance_window(window), start,
                                          info.sample_rate, name)
                joiner.add(start, end, geometry, window, enhanced)
        except BaseException:
            joiner.abandon()
            raise
    return joiner.close()
