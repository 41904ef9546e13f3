"""speechlens_cli.runtime: where the model runs, decided once, and a process that importing
speechlens leaves as it was; runtime.prepare() (the CLI's entry point, the API's model loading)
makes a run's changes, restore() undoes them, opt_out() declines them.

What a process holds (its environment, its loaded libraries, glibc's settings) is checked in a
fresh child process each time: the test session's own is prepared (fixtures/__init__.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlx.core as mx
import pytest

from speechlens_cli import api, kernels, runtime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: What prepare() reads or sets, none of them set in the children (a user's environment).
VARIABLES = ("MLX_ENABLE_TF32", "MLX_MAX_MB_PER_BUFFER", "MLX_PTX_CACHE_DIR", "SPEECHLENS_BLAS",
             "SPEECHLENS_HEAP")

#: The child's view of its process: the environment, whether a cblas_sgemm is visible to every
#: library (the BLAS shim loaded with RTLD_GLOBAL), and how many MiB of a freed 128-MiB array
#: stay resident (glibc's defaults return it to the kernel; speechlens's heap keeps it).
_LOOK = """
import ctypes, json, os, sys
def look():
    import numpy as np
    def resident():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    before = resident()
    a = np.ones(2**25, np.float32); del a
    return {"env": dict(os.environ), "global_sgemm": hasattr(ctypes.CDLL(None), "cblas_sgemm"),
            "kept_mib": int(resident() - before), "mlx": "mlx.core" in sys.modules}
"""

needs_linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="the BLAS shim and glibc's heap are Linux's")


def _child(body: str, *args: str, env: dict | None = None) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    done = subprocess.run([sys.executable, "-c", _LOOK + body, *args], capture_output=True,
                          text=True, cwd=REPO, timeout=300, check=False,
                          env={**environment, **(env or {})})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


_IMPORT_ALL = """
import importlib, pkgutil
untouched = look()
import speechlens_cli
package_only = look()
skipped = []
for module in pkgutil.walk_packages(speechlens_cli.__path__, "speechlens_cli."):
    if module.name.rpartition(".")[2].startswith("_"):   # __main__, the C libraries
        continue
    try:
        importlib.import_module(module.name)
    except ImportError as missing:   # an optional package (torch for the bench's peers)
        skipped.append(missing.name)
print(json.dumps({"untouched": untouched, "package": package_only, "all": look(),
                  "skipped": skipped}))
"""


@needs_linux
def test_importing_speechlens_changes_nothing_in_the_process():
    """The package and every module of it: no variable set, no BLAS made global, glibc's
    settings as they were; the package alone does not even import MLX."""
    seen = _child(_IMPORT_ALL)
    untouched = seen["untouched"]
    assert untouched["kept_mib"] < 20 and not untouched["global_sgemm"], untouched
    assert not seen["package"]["mlx"]
    for stage in ("package", "all"):
        assert seen[stage]["env"] == untouched["env"], stage
        assert not seen[stage]["global_sgemm"], stage
        assert seen[stage]["kept_mib"] < 20, (stage, seen[stage]["kept_mib"])
    assert seen["all"]["mlx"]   # the modules were imported, MLX with them
    assert set(seen["skipped"]) <= {"torch", "onnxruntime"}, seen["skipped"]


_PREPARE = """
from speechlens_cli import blas, heap, runtime
runtime.prepare(); runtime.prepare()      # once
prepared = {**look(), "blas": blas.loaded, "heap": heap.status, "is": runtime.is_prepared()}
runtime.restore()
restored = {**look(), "is": runtime.is_prepared()}
runtime.opt_out(); runtime.prepare()
print(json.dumps({"prepared": prepared, "restored": restored, "declined": look()}))
"""


@needs_linux
def test_prepare_makes_a_runs_changes_and_restore_undoes_them():
    seen = _child(_PREPARE)
    prepared, restored = seen["prepared"], seen["restored"]
    assert prepared["is"] and prepared["env"]["MLX_ENABLE_TF32"] == runtime.TF32_OFF
    assert prepared["heap"].startswith("glibc heap keeps") and prepared["kept_mib"] >= 100
    assert prepared["global_sgemm"] == (prepared["blas"] is not None)
    assert "MLX_MAX_MB_PER_BUFFER" not in prepared["env"] or runtime.gpu_backend() == "cuda"
    assert not restored["is"]
    assert not set(VARIABLES) & set(restored["env"]), restored["env"]
    assert restored["kept_mib"] < 20
    declined = seen["declined"]
    assert "MLX_ENABLE_TF32" not in declined["env"] and declined["kept_mib"] < 20


@needs_linux
def test_prepare_keeps_what_the_user_set():
    seen = _child(_PREPARE, env={"MLX_ENABLE_TF32": "1", "SPEECHLENS_HEAP": "default",
                                 "SPEECHLENS_BLAS": "off"})
    prepared = seen["prepared"]
    assert prepared["env"]["MLX_ENABLE_TF32"] == "1"
    assert prepared["heap"] == "glibc defaults (SPEECHLENS_HEAP=default)"
    assert prepared["kept_mib"] < 20 and not prepared["global_sgemm"]
    assert seen["restored"]["env"]["MLX_ENABLE_TF32"] == "1"


_AS_ON_CUDA = """
import sys
from speechlens_cli import runtime
runtime.gpu_backend = lambda: "cuda"   # as on a CUDA build of MLX: only the variables differ
runtime.prepare()
prepared = look()
runtime.restore()
print(json.dumps({"prepared": prepared, "restored": look()}))
"""


@needs_linux
def test_on_cuda_mlxs_compiled_kernels_go_to_speechlens_cache_folder(tmp_path):
    """MLX's CUDA backend keeps the kernels it compiles in $TMPDIR/mlx unless MLX_PTX_CACHE_DIR
    says otherwise; prepared, they are kept in speechlens's cache folder (and its command graphs
    bounded), unless the user set the variables."""
    seen = _child(_AS_ON_CUDA, env={"SPEECHLENS_CACHE_DIR": str(tmp_path)})
    env = seen["prepared"]["env"]
    assert env["MLX_PTX_CACHE_DIR"] == str(tmp_path / runtime.PTX_CACHE)
    assert env["MLX_MAX_MB_PER_BUFFER"] == str(runtime.CUDA_GRAPH_MB)
    assert "MLX_PTX_CACHE_DIR" not in seen["restored"]["env"]
    mine = _child(_AS_ON_CUDA, env={"MLX_PTX_CACHE_DIR": "/somewhere/else"})
    assert mine["prepared"]["env"]["MLX_PTX_CACHE_DIR"] == "/somewhere/else"


_ENTRY = """
import sys
from speechlens_cli import blas, heap
if sys.argv[1] == "cli":
    from speechlens_cli.__main__ import main
    main(["--version"], standalone_mode=False)
else:
    import speechlens_cli
    speechlens_cli.get_model(sys.argv[2])
print(json.dumps({**look(), "blas": blas.status, "heap": heap.status}))
"""


@needs_linux
@pytest.mark.parametrize("entry", ["cli", "api"])
def test_the_cli_and_the_packages_functions_prepare_before_mlx(entry, tiny_checkpoint):
    """The CLI's entry point and speechlens_cli.get_model (enhance, enhance_file): prepared
    before MLX is imported, so the BLAS too, as a CLI run always had."""
    seen = _child(_ENTRY, entry, str(tiny_checkpoint))
    assert seen["env"]["MLX_ENABLE_TF32"] == runtime.TF32_OFF
    assert seen["heap"].startswith("glibc heap keeps") and seen["kept_mib"] >= 100
    assert "MLX was imported before" not in seen["blas"] and seen["blas"] != "not attempted"
    assert seen["global_sgemm"] == seen["blas"].startswith("using ")


def test_one_runtime_per_device_read_off_mlxs_default_device(on_cpu, monkeypatch):
    here = runtime.current()
    assert here == runtime.Runtime("cpu", "cpu", runtime.gpu_backend())
    assert here is runtime.current() and here.on_cpu and here.host_memory
    with pytest.raises(AttributeError):
        here.device = "gpu"
    assert kernels.backend() == "cpu" and kernels.gpu_backend() == runtime.gpu_backend()
    assert api.select_device("cpu") == "cpu" and runtime.current() is here
    monkeypatch.setattr(mx, "default_device", lambda: mx.gpu)   # as if on a GPU
    gpu = runtime.current()
    assert gpu.device == "gpu" and not gpu.on_cpu
    assert gpu.backend == (runtime.gpu_backend() or "cpu") == kernels.backend()
    assert gpu.host_memory == (runtime.gpu_backend() == "metal")


def test_use_takes_a_device_name():
    with pytest.raises(ValueError, match="'gpu' or 'cpu'"):
        runtime.use("auto")
