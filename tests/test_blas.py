"""The optimized BLAS behind MLX's Linux CPU backend: fast, correct, and independent of threads.

OpenBLAS splits a product across its threads at boundaries that depend on the thread count, and
on AMD Zen (OpenBLAS's Haswell kernels) rows on either side of a boundary round differently, so
1 and 2 threads gave different bytes there. The shim runs the BLAS single-threaded over row
blocks fixed by the shape; these tests run the same products under several thread counts, each
in a fresh process (the count is read when the BLAS is loaded, by runtime.prepare() before MLX
is imported), on MLX's CPU device on any machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from speechlens_cli import blas

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: (M, K, N, transpose B): the model's shapes (dense-block convs as matmuls, in/out projections)
#: and edge cases: one row block, a partial last block, below and above the splitting threshold.
SHAPES = [(16789, 96, 16, False), (2106, 48, 16, True), (8211, 64, 512, True),
          (255, 64, 64, False), (257, 2048, 8, True), (3, 5, 7, False), (40000, 1, 64, False)]
#: Largest error against float64, relative to the products' scale (sum of |a||b| terms).
FLOAT32_BOUND = 1e-6

_CHILD = """
import json, sys
import numpy as np
from speechlens_cli import blas, runtime
runtime.prepare()
import mlx.core as mx
mx.set_default_device(mx.cpu)  # the BLAS is the CPU backend's (a GPU does its own matmuls)
shapes, folder = json.loads(sys.argv[1]), sys.argv[2]
for i, (m, k, n, trans_b) in enumerate(shapes):
    rng = np.random.default_rng(i)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n), dtype=np.float32)
    a_mx, b_mx = mx.array(a), mx.array(b)
    out = mx.matmul(a_mx, b_mx.T if trans_b else b_mx)
    np.save(f"{folder}/{i}.npy", np.array(out))
print(json.dumps({"status": blas.status, "threads": blas.threads, "loaded": blas.loaded}))
"""

needs_linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="the BLAS shim is for MLX's Linux CPU backend")


def _run(tmp_path, name: str, threads: str | None) -> tuple[dict, list[np.ndarray]]:
    folder = tmp_path / name
    folder.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", blas.BLAS_ENV)}
    if threads is not None:
        env["OPENBLAS_NUM_THREADS"] = threads
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(SHAPES), str(folder)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), [np.load(folder / f"{i}.npy") for i in range(len(SHAPES))]


@needs_linux
def test_matmuls_are_byte_identical_at_any_thread_count(tmp_path):
    default, want = _run(tmp_path, "default", None)
    if default["loaded"] is None:
        pytest.skip(f"no optimized BLAS here: {default['status']}")
    assert "independent of the thread count" in default["status"], default["status"]
    for threads in ("1", "2", "3"):
        report, got = _run(tmp_path, f"threads-{threads}", threads)
        # OpenBLAS caps its thread count at the cores it sees
        assert report["threads"] == min(int(threads), default["threads"]), report
        for shape, a, b in zip(SHAPES, got, want, strict=True):
            same = np.array_equal(a.view(np.uint32), b.view(np.uint32))
            assert same, f"{threads} thread(s) changed the bytes of {shape}"
    for i, (m, k, n, trans_b) in enumerate(SHAPES):
        rng = np.random.default_rng(i)
        a = rng.standard_normal((m, k), dtype=np.float32).astype(np.float64)
        b = rng.standard_normal((n, k) if trans_b else (k, n), dtype=np.float32)
        b = b.astype(np.float64).T if trans_b else b.astype(np.float64)
        exact, scale = a @ b, np.abs(a) @ np.abs(b)
        assert np.max(np.abs(want[i] - exact) / scale) <= FLOAT32_BOUND, (m, k, n)


@needs_linux
def test_a_disabled_blas_is_reported(tmp_path):
    env = {**os.environ, blas.BLAS_ENV: "off"}
    done = subprocess.run([sys.executable, "-c", "from speechlens_cli import blas, runtime; "
                           "runtime.prepare(); print(blas.status, blas.loaded, blas.threads)"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120,
                          check=False)
    assert done.stdout.strip() == f"disabled by {blas.BLAS_ENV} None None", done.stderr


@needs_linux
def test_scipy_openblas_is_the_library_and_version_its_package_names():
    """blas finds scipy-openblas32's library without importing the package (whose __init__
    imports importlib.metadata, ~30 modules a run needs nowhere else): the file is the one the
    package's own functions name, and the version in blas.status the package's."""
    package = pytest.importorskip("scipy_openblas32")
    named = os.path.join(package.get_lib_dir(), f"lib{package.get_library()}.so")
    assert os.path.samefile(blas.scipy_openblas_path(), named)
    done = subprocess.run([sys.executable, "-c", "import sys; from speechlens_cli import blas, "
                           "runtime; runtime.prepare(); print(blas.status); "
                           "print('scipy_openblas32' in sys.modules)"],
                          capture_output=True, text=True, cwd=REPO, timeout=120, check=True,
                          env={k: v for k, v in os.environ.items() if k != blas.BLAS_ENV})
    status, imported = done.stdout.splitlines()
    assert status.startswith(f"using scipy-openblas32 {package.__version__}, "), status
    assert imported == "False"
