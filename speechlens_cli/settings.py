"""Every environment variable speechlens interprets, declared once: name, default, what a valid
value is, and one line of help (README's table of variables and `speechlens doctor` read ALL).

A value is read from the environment at each use and parsed here only: importing reads nothing,
and a change to os.environ (a test's monkeypatch.setenv, an API user's own) counts from the next
use, with no cache to reload. One rule for every variable: unset or blank is the default; a
switch is on for 1, true, yes or on and off for 0, false, no or off (any case); any other value
is a SettingError naming the variable. MLX_ENABLE_TF32 is MLX's: read as MLX reads it (an
integer, nonzero is on; blank is 0), and a value MLX would misread is refused. A launcher's
variables are the exception: never refused, as they may be leftovers in a shell; and so are the
other programs' variables speechlens reads (Hugging Face's client, XDG, CXX, the CUDA toolkit,
Rich), which their owners read their own way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")
#: The CPU kernel builds SPEECHLENS_CPU_ISA names (kernels.build.CPU_ISAS and "best": a test
#: holds them equal; importing the kernels here would import MLX).
CPU_ISA_NAMES = ("best", "avx512", "avx2", "generic")
#: SPEECHLENS_BLAS values that load no BLAS (MLX's own reference matmul).
BLAS_OFF = ("off", "0", "none", "reference")
#: A day: select() takes no more than about 292 years, and no group takes a day to form.
MAX_JOIN_TIMEOUT_S = 86400.0


class SettingError(UsageError):
    """A variable's value that its declaration refuses; `setting` says which, and what would
    fix it, so a caller (doctor) never reads the message."""

    def __init__(self, setting: Setting, text: str):
        super().__init__(f"{setting.name} must be {setting.expects}, got {text[:40]!r}")
        self.setting = setting

    @property
    def fix(self) -> str:
        return f"unset {self.setting.name} or set it to {self.setting.expects}"


@dataclass(frozen=True)
class Setting:
    """One variable. `parse` takes the stripped text and raises ValueError on a bad one."""

    name: str
    parse: Callable[[str], object]
    default: object
    expects: str
    help: str
    #: A blank value is the default (False: it is parsed, as MLX's atoi reads "" as 0).
    blank_is_default: bool = True

    def value(self, env: Mapping[str, str] | None = None):
        """The value in `env` (default: this process's environment), else the default."""
        text = (os.environ if env is None else env).get(self.name)
        if text is None or (self.blank_is_default and not text.strip()):
            return self.default
        try:
            return self.parse(text.strip())
        except ValueError:
            raise SettingError(self, text.strip()) from None

    def raw(self, env: Mapping[str, str] | None = None) -> str | None:
        """The text as set, unparsed and unstripped (None where unset): for a variable another
        program reads as it is (HF_ENDPOINT), or whose mere presence counts (FORCE_COLOR)."""
        return (os.environ if env is None else env).get(self.name)

    def shown(self) -> str:
        """NAME=value as set now (stripped), for a message naming the setting that decided."""
        return f"{self.name}={(self.raw() or '').strip()}"

    def is_set(self, env: Mapping[str, str] | None = None) -> bool:
        return bool((os.environ if env is None else env).get(self.name, "").strip())


def _switch(text: str) -> bool:
    if text.lower() in _ON:
        return True
    if text.lower() in _OFF:
        return False
    raise ValueError(text)


#: A count of more digits reads as this (int() refuses 4,300 digits; no machine has more).
_MAX_COUNT = 10**18


def _count(text: str) -> int:
    """ASCII digits above 0 (int() takes any script's digits)."""
    if not (text.isascii() and text.isdigit()) or not text.strip("0"):
        raise ValueError(text)
    return int(text) if len(text) <= 18 else _MAX_COUNT


def _mlx_integer(text: str) -> bool:
    """MLX's atoi: an integer is read, anything else as 0, so "true" would be off: refused."""
    digits = text[1:] if text[:1] in "+-" else text
    if text and not (digits.isascii() and digits.isdigit()):
        raise ValueError(text)
    return bool(text) and int(text) != 0


def _cpu_isa(text: str) -> str:
    if text.lower() not in CPU_ISA_NAMES:
        raise ValueError(text)
    return text.lower()


def _seconds(text: str) -> float:
    """Seconds above 0 and at most a day, in ASCII (float() takes any script's digits, "nan"
    and "inf" too)."""
    seconds = float(text) if text.isascii() else float("nan")
    if not 0 < seconds <= MAX_JOIN_TIMEOUT_S:
        raise ValueError(text)
    return seconds


def _is_default(text: str) -> bool:
    """SPEECHLENS_HEAP: read when the process is prepared (runtime.prepare, before the CLI's
    error handling), so no value is refused (an error there would be a traceback, not one
    line)."""
    return text.lower() == "default"


def _blas(text: str) -> str | None:
    """None for a value that loads no BLAS, else the library's name or path (read when the
    process is prepared, as SPEECHLENS_HEAP: no value is refused)."""
    return None if text.lower() in BLAS_OFF else text


def _launcher_number(text: str) -> int | None:
    """A launcher's size or rank: ASCII digits, at most 12 (int() takes any script's, and '²'
    breaks it); None for anything else, a leftover that makes no launch."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 12 else None


_SWITCH = "1, true, yes or on, or 0, false, no or off"
#: A launcher's variables are never refused: left in a shell, they must not stop a run alone.
_LAUNCHER = "a launcher's (never refused)"

MODEL = Setting("SPEECHLENS_MODEL", str, None, "a checkpoint path or a Hugging Face repo id",
                "the checkpoint used when --model is not given (default: nvidia/RE-USE)")
ACCEPT_LICENSE = Setting("SPEECHLENS_ACCEPT_LICENSE", _switch, False, _SWITCH,
                         "on: NVIDIA's license for the RE-USE weights is accepted (scripts)")
CACHE_DIR = Setting("SPEECHLENS_CACHE_DIR", Path, None, "a folder",
                    "compiled kernels and measured speeds (default: "
                    "$XDG_CACHE_HOME/speechlens, else ~/.cache/speechlens)")
KERNEL_DIR = Setting("SPEECHLENS_KERNEL_DIR", Path, None, "a folder",
                     "the kernel sources (default: the installed package's, or the checkout's)")
BLAS = Setting("SPEECHLENS_BLAS", _blas, "", "a BLAS library's name or path, or off",
               "the BLAS loaded for MLX's CPU matmuls (default: the first optimized one found; "
               f"{', '.join(BLAS_OFF)}: none)")
HEAP = Setting("SPEECHLENS_HEAP", _is_default, False, "default",
               "default: leave glibc's large-block settings alone (Linux; other values: "
               "speechlens' settings)")
CPU_ISA = Setting("SPEECHLENS_CPU_ISA", _cpu_isa, "best", "one of " + ", ".join(CPU_ISA_NAMES),
                  "the CPU kernels' build (default: the best this CPU runs)")
_THREADS = "a whole number of threads (1 or more)"
CPU_THREADS = Setting("SPEECHLENS_CPU_THREADS", _count, None, _THREADS,
                      "threads of the CPU kernels, at most the usable cores (default: all)")
GPU_THREADGROUP = Setting("SPEECHLENS_GPU_THREADGROUP", _count, None, _THREADS,
                          "threads per group of the GPU conv kernels and per block of the CUDA "
                          "scan (default: each kernel's own)")
CUDA_PROJECTION = Setting("SPEECHLENS_CUDA_PROJECTION", _switch, True, _SWITCH,
                          "off: the projections run as MLX matmuls on CUDA")
CUDA_PROJECT_CONV = Setting("SPEECHLENS_CUDA_PROJECT_CONV", _switch, True, _SWITCH,
                            "off: a BiMamba's in_proj and its conv run as two CUDA kernels")
CUDA_CONV2D = Setting("SPEECHLENS_CUDA_CONV2D", _switch, True, _SWITCH,
                      "off: the 2-D convolutions run as MLX matmuls on CUDA")
DISABLE_CONV1D = Setting("SPEECHLENS_DISABLE_METAL_CONV1D", _switch, False, _SWITCH,
                         "on: the causal conv1d runs as MLX ops instead of its kernel")
DISABLE_CONV1D_ALIAS = Setting("SPEECHLENS_DISABLE_CONV1D_KERNEL", _switch, False, _SWITCH,
                               "the same as SPEECHLENS_DISABLE_METAL_CONV1D")
JOIN_TIMEOUT_S = Setting("SPEECHLENS_JOIN_TIMEOUT_S", _seconds, 60.0,
                         f"a number of seconds above 0 and at most {MAX_JOIN_TIMEOUT_S:g}",
                         "how long a launched process waits for its ring group to form")
BENCH_REVISION = Setting("SPEECHLENS_BENCH_REVISION", str, None, "a revision",
                         "the source revision a bench report names (default: git's)")
TF32 = Setting("MLX_ENABLE_TF32", _mlx_integer, True, "an integer (0: off)",
               "MLX's TF32 matmuls and convolutions; speechlens sets 0 (full float32) unless "
               "it is set", blank_is_default=False)
MAX_MB_PER_BUFFER = Setting("MLX_MAX_MB_PER_BUFFER", _count, None, "a whole number above 0",
                            "MLX's CUDA command-graph size, read by MLX; speechlens sets 10 on "
                            "CUDA unless it is set")
PTX_CACHE_DIR = Setting("MLX_PTX_CACHE_DIR", Path, None, "a folder",
                        "where MLX's CUDA backend keeps the kernels it compiles; speechlens sets "
                        "mlx-ptx in its cache folder unless it is set (MLX's own default is "
                        "$TMPDIR/mlx)")

# The launchers' variables distributed/launcher.py reads: only a full, consistent set is a launch.
def _launcher(name: str, help: str, parse: Callable[[str], object] = _launcher_number) -> Setting:
    return Setting(name, parse, None, _LAUNCHER, help)


MLX_RANK = _launcher("MLX_RANK", "mlx.launch: this process's rank (with MLX_HOSTFILE, "
                     "NCCL_HOST_IP or MLX_IBV_DEVICES)")
JACCL_RANK = _launcher("JACCL_RANK", "mlx.launch (jaccl): this process's rank")
MLX_HOSTFILE = _launcher("MLX_HOSTFILE", "mlx.launch (ring): the JSON list of hosts; a group "
                         "of more than one", Path)
MLX_WORLD_SIZE = _launcher("MLX_WORLD_SIZE", "mlx.launch (nccl): processes in the group")
NCCL_HOST_IP = _launcher("NCCL_HOST_IP", "mlx.launch (nccl): the host", str)
MLX_IBV_DEVICES = _launcher("MLX_IBV_DEVICES", "mlx.launch (jaccl): the RDMA devices", str)
JACCL_IBV_DEVICES = _launcher("JACCL_IBV_DEVICES", "the same as MLX_IBV_DEVICES", str)
OMPI_SIZE = _launcher("OMPI_COMM_WORLD_SIZE", "mpirun (Open MPI): processes in the group")
OMPI_RANK = _launcher("OMPI_COMM_WORLD_RANK", "mpirun (Open MPI): this process's rank")
PMI_SIZE = _launcher("PMI_SIZE", "mpirun (MPICH): processes in the group")
PMI_RANK = _launcher("PMI_RANK", "mpirun (MPICH): this process's rank")



# Other programs' variables speechlens reads too (Hugging Face's client, XDG, a C++ compiler,
# the CUDA toolkit, Rich): never refused, as their owners read them their own way.
def _hf_switch(text: str) -> bool:
    """On as huggingface_hub reads it (1, true, yes, on; any case), off for anything else."""
    return text.lower() in _ON


def _external(name: str, expects: str, help: str, parse: Callable[[str], object] = str,
              default: object = None) -> Setting:
    return Setting(name, parse, default, expects, help)


HF_HOME = _external("HF_HOME", "a folder (Hugging Face's, never refused)",
                    "read by huggingface_hub: its folder, the model cache under it unless "
                    "HF_HUB_CACHE is set (default: ~/.cache/huggingface)", Path)
HF_HUB_CACHE = _external("HF_HUB_CACHE", "a folder (Hugging Face's, never refused)",
                         "the model cache speechlens and huggingface_hub use (default: "
                         "$HF_HOME/hub)")
HF_ENDPOINT = _external("HF_ENDPOINT", "an http(s) URL (Hugging Face's, checked at use)",
                        "the hub models are pulled from (default: https://huggingface.co)")
HF_HUB_OFFLINE = _external("HF_HUB_OFFLINE", "1, true, yes or on (Hugging Face's, never "
                           "refused)", "on: no network; the model must be cached", _hf_switch,
                           False)
XDG_CACHE_HOME = _external("XDG_CACHE_HOME", "a folder (XDG's, never refused)",
                           "the cache is $XDG_CACHE_HOME/speechlens unless SPEECHLENS_CACHE_DIR "
                           "is set (default: ~/.cache)", Path)
XDG_DATA_HOME = _external("XDG_DATA_HOME", "a folder (XDG's, never refused)",
                          "where bench reports go without --out (default: ~/.local/share)", Path)
CXX = _external("CXX", "a C++ compiler command (never refused)",
                "the compiler of the CPU kernels when none was installed with them (default: "
                "c++, g++ or clang++ on PATH)")
CUDA_HOME = _external("CUDA_HOME", "a CUDA toolkit folder (never refused)",
                      "where NVRTC is looked for after the loaded and pip-installed ones")
CUDA_PATH = _external("CUDA_PATH", "a CUDA toolkit folder (never refused)",
                      "the same as CUDA_HOME, looked at after it")
FORCE_COLOR = _external("FORCE_COLOR", "any value (Rich's, never refused)",
                        "set: stderr may be a terminal, so progress bars are drawn (Rich's)")
TTY_COMPATIBLE = _external("TTY_COMPATIBLE", "any value (Rich's, never refused)",
                           "the same as FORCE_COLOR for the bars")

ALL = (MODEL, ACCEPT_LICENSE, CACHE_DIR, KERNEL_DIR, BLAS, HEAP, CPU_ISA, CPU_THREADS,
       GPU_THREADGROUP, CUDA_PROJECTION, CUDA_PROJECT_CONV, CUDA_CONV2D, DISABLE_CONV1D,
       DISABLE_CONV1D_ALIAS, JOIN_TIMEOUT_S, BENCH_REVISION, TF32, MAX_MB_PER_BUFFER,
       PTX_CACHE_DIR, MLX_RANK, JACCL_RANK, MLX_HOSTFILE, MLX_WORLD_SIZE, NCCL_HOST_IP,
       MLX_IBV_DEVICES, JACCL_IBV_DEVICES, OMPI_SIZE, OMPI_RANK, PMI_SIZE, PMI_RANK, HF_HOME,
       HF_HUB_CACHE, HF_ENDPOINT, HF_HUB_OFFLINE, XDG_CACHE_HOME, XDG_DATA_HOME, CXX, CUDA_HOME,
       CUDA_PATH, FORCE_COLOR, TTY_COMPATIBLE)


def problems(env: Mapping[str, str] | None = None) -> list[SettingError]:
    """Every variable whose value its declaration refuses (doctor's settings check)."""
    found = []
    for setting in ALL:
        try:
            setting.value(env)
        except SettingError as error:
            found.append(error)
    return found
