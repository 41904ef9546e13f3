"""What a benchmark report names: hardware, OS, toolchain and MLX versions, backend, BLAS, build."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys

import mlx.core as mx

from .. import __version__, blas, heap, kernels, settings


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                             text=True, check=False, timeout=5).stdout.strip()
        if out:
            return out
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


def memory_total_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def gpu_name() -> str | None:
    """The GPU MLX runs on, or None on the CPU backend."""
    if kernels.backend() == "cpu":
        return None
    try:
        info = mx.device_info()
        for key in ("device_name", "name", "architecture"):
            if info.get(key):
                name = str(info[key])
                break
        else:
            name = None
    except Exception:  # noqa: BLE001 - informational only
        name = None
    if kernels.backend() == "cuda":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 check=False, timeout=20).stdout.strip()
            if out:
                return out.splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return name or "unknown GPU"


def compiler_version() -> str:
    cxx = kernels.find_cxx()
    if cxx is None:
        return "no C++ compiler found"
    try:
        out = subprocess.run([*cxx.split(), "--version"], capture_output=True, text=True,
                             check=False, timeout=10).stdout
        return out.splitlines()[0].strip() if out else cxx
    except (OSError, subprocess.SubprocessError):
        return cxx


def machine_kind() -> str:
    """Short file-name-safe label: backend plus hardware (cpu-<cpu>-<n>cores, cuda-<gpu>)."""
    which = kernels.backend()
    if which == "cpu":
        label = f"{cpu_model()}-{kernels.usable_cores()}cores"
    else:
        label = (gpu_name() or "gpu").split(",")[0]
    label = re.sub(r"\((R|TM)\)|\bprocessor\b|\bcpu\b", "", label, flags=re.IGNORECASE)
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    return f"{which}-{slug}"[:80]


#: The checkout (or site-packages folder) holding the package.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shown_path(path: str) -> str:
    """A path as a report shows it: relative to the checkout when inside it, under ~ when in
    the home folder, so a committed report names no one's machine."""
    full = os.path.abspath(path)
    home = os.path.expanduser("~")
    if os.path.commonpath([full, _ROOT]) == _ROOT:
        return os.path.relpath(full, _ROOT)
    if os.path.commonpath([full, home]) == home:
        return os.path.join("~", os.path.relpath(full, home))
    return full


def revision() -> str:
    """The source revision measured: $SPEECHLENS_BENCH_REVISION, else git (marked if dirty)."""
    given = settings.BENCH_REVISION.value()
    if given:
        return given
    root = _ROOT
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=False, timeout=10)
        if head.returncode != 0:
            return "unknown (not a git checkout)"
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=False, timeout=10).stdout
        return head.stdout.strip() + (" with uncommitted changes" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment(peer: dict | None = None) -> dict[str, str]:
    """Everything a report must name to be reproduced (hardware, software, kernels, settings),
    as display strings."""
    info = kernels.kernel_info()
    which = info["backend"]
    env = {
        "speechlens": f"{__version__}, revision {revision()}",
        "cpu": f"{cpu_model()} ({kernels.usable_cores()} usable of {os.cpu_count()} logical CPUs)",
        "memory": (f"{memory_total_gib():.1f} GiB" if memory_total_gib() else "unknown"),
        "gpu": gpu_name() or "none used (MLX CPU backend)",
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "mlx": mx.__version__,
        "mlx backend": which,
        "mlx default device": str(mx.default_device()),
        "blas": blas.status,
        "heap": heap.status,
    }
    if which == "cpu":
        lib = kernels.cpu_library()
        where = shown_path(str(lib.path)) if lib else info.get("cpu_library", "-")
        env["cpu kernels"] = (f"{where}; {info.get('cpu_isa', '-')}; "
                              f"{info.get('cpu_threads', '-')} threads")
        env["cpu kernel build"] = (f"{compiler_version()}; flags "
                                   f"{' '.join(kernels.CPU_COMPILE_FLAGS)}")
    else:
        env["gpu kernels"] = info.get("gpu_kernels", f"mx.fast.{which}_kernel")
        if "cuda_compilation" in info:
            env["cuda kernel compilation"] = info["cuda_compilation"]
            env["cuda tensor-core kernels"] = (
                f"projections: {info['cuda_projections']}; encoder/decoder convs: "
                f"{info['cuda_conv2d']}; Mamba conv: {info['cuda_mamba_conv']}")
    given = {k: v for k, v in os.environ.items()
             if k.startswith(("SPEECHLENS_", "OMP_", "OPENBLAS_", "MLX_"))}
    env["environment variables"] = ", ".join(f"{k}={v}" for k, v in sorted(given.items())) or "-"
    if peer:
        env.update(peer)
    try:
        env["load average at start"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        pass
    env["argv"] = " ".join(sys.argv[1:]) or "-"
    return env


def load_average() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "-"
