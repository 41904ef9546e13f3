#!/usr/bin/env python3
"""The whole test suite on an offline Linux NVIDIA host, from wheels gathered elsewhere.

The host: Linux x86_64, CPython 3.12 as `python3`, an NVIDIA driver and CUDA 13 libraries (the
H200 host's PyTorch brings them), gcc and g++, no package index. Three steps (the Makefile's
gpu-wheels, gpu-install and gpu-test targets; README.md, "Set-up for development"):

  wheels      on a machine with a package index (Linux x86_64, Python >= 3.11): resolve the
              project, its `cuda` and `dev` extras, pip and the build requirements for CPython
              3.12 on manylinux x86_64, download the wheels and pack them into WHEELS/part1,
              part2, ... of at most --part-bytes each (60 MB: one transfer to the host carries
              one part); a wheel larger than that (MLX's CUDA build, ~90 MB) is cut into
              pieces across parts. Each part holds the manifest of all of them. pip checks
              the dependencies' Requires-Python and markers against the Python that runs it:
              under 3.12 it picks the newest releases for the host, under 3.11 those that run
              on both (numpy 2.4 and av 18 rather than 2.5 and 19, as in a 3.11 `make install`);
              `install` runs `pip check` there either way.
  install     on the host, once every part is there: join the pieces (sha256 checked), make a
              fresh virtual environment (VENV) without the host's packages, and install into
              it, with no index, the wheels and the project itself (editable: the checkout's
              tests import it; setup.py compiles its CPU kernel and BLAS libraries with g++ and
              gcc), console scripts included (VENV/bin/speechlens, VENV/bin/mlx.launch). Then
              checks that MLX sees the GPU, the optimized BLAS loads and `pip check` finds
              nothing missing. Does nothing when that environment is already up to date.
  test PART   on the host: one part of the suite (`parts` lists them; each is meant to fit in
              the host's 10 minutes a command, `all` runs them one after another) with that
              environment's Python, writing RESULTS/partPART.xml (JUnit), partPART.log and a
              line in RESULTS/summary.txt.

Not gathered: NVIDIA's CUDA libraries (nvidia-cublas, -cudnn-cu13, -cufft, -cusolver, -cusparse,
-nccl-cu13, -nvjitlink, -cuda-runtime, -cuda-nvrtc: 1.9 GB of wheels, which mlx-cuda-13 and the
`dev` extra ask for): the host has them already, and `install` points MLX at the host's copy if
it does not find them by itself. Nor mlx-cpu (the `mlx[cpu]` dependency): its libmlx.so would
replace mlx-cuda-13's, which runs on the CPU as well.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = "3.12"
#: glibc 2.35 is the newest manylinux tag MLX's CUDA wheel needs; the host runs it.
GLIBC_MINORS = range(35, 4, -1)
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in GLIBC_MINORS] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
#: Environment markers of the host, for the project's own requirements.
HOST_MARKERS = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                "os_name": "posix", "python_version": PYTHON, "python_full_version": "3.12.3",
                "implementation_name": "cpython", "platform_python_implementation": "CPython"}
#: Resolved but not gathered: the host's own CUDA libraries, and what would break the set.
HOST_PROVIDED = re.compile(r"nvidia-.*")
LEFT_OUT = {"mlx-cpu": "its libmlx.so would replace mlx-cuda-13's"}
PART_BYTES = 60_000_000
MANIFEST = "manifest.json"
STAMP = ".speechlens-gpu-suite"
#: The parts of the suite, each within the host's 10 minutes a command: (marker, file glob).
#: The slow tests are two parts: test_reliability_inputs.py's hour of audio through the tiny
#: model (646 s on an idle 2-core CPU; the model runs on the GPU there) gets one to itself.
PARTS = {"1": ("not slow", "test_[a-l]*.py"),
         "2": ("not slow", "test_[m-z]*.py"),
         "3": ("slow", "test_[a-q]*.py"),
         "4": ("slow", "test_[r-z]*.py")}
#: Without a GPU (trying the recipe elsewhere), `install` stops unless this is set to 1.
CPU_OK_ENV = "SPEECHLENS_GPU_SUITE_CPU_OK"


def say(text: str) -> None:
    print(f"gpu-suite: {text}", flush=True)


def fail(text: str) -> None:
    raise SystemExit(f"gpu-suite: error: {text}")


def run(command: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], check=True, **kwargs)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------------------ wheels

def requirements() -> list[str]:
    """The project's dependencies, its `cuda` and `dev` extras, its build requirements and pip,
    as they apply to the host (markers evaluated for it, then dropped)."""
    try:
        import tomllib
    except ImportError:
        fail("reading pyproject.toml needs Python >= 3.11 (tomllib)")
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = data["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["cuda"],
              *project["optional-dependencies"]["dev"], *data["build-system"]["requires"], "pip"]
    kept = []
    for text in wanted:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(HOST_MARKERS):
            requirement.marker = None
            kept.append(str(requirement))
    return kept


def target_options() -> list[str]:
    options = ["--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp"]
    for platform in PLATFORMS:
        options += ["--platform", platform]
    return options


def resolve(requirements: list[str], scratch: Path) -> list[tuple[str, str]]:
    """(name, version) of every distribution the host needs, resolved by pip for the host."""
    report = scratch / "report.json"
    run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", report, *target_options(), "--target", scratch / "target", *requirements])
    found = json.loads(report.read_text())["install"]
    return sorted((item["metadata"]["name"], item["metadata"]["version"]) for item in found)


def wheels(dest: Path, part_bytes: int) -> None:
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        say(f"warning: resolving on {sys.platform}/{os.uname().machine}: the dependencies' own "
            "markers are evaluated for this machine, not for the Linux x86_64 host")
    wanted = requirements()
    say("resolving for CPython 3.12, manylinux x86_64: " + ", ".join(wanted))
    with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as scratch_name:
        scratch = Path(scratch_name)
        resolved = resolve(wanted, scratch)
        gathered = []
        for name, version in resolved:
            key = canonical(name)
            if HOST_PROVIDED.fullmatch(key):
                say(f"not gathered: {name} {version} (the host's own CUDA libraries)")
            elif key in LEFT_OUT:
                say(f"not gathered: {name} {version} ({LEFT_OUT[key]})")
            else:
                gathered.append((name, version))
        download = scratch / "download"
        run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *target_options(),
             "--dest", download, *[f"{name}=={version}" for name, version in gathered]])
        files = sorted(download.glob("*.whl"))
        names = {canonical(f.name.split("-")[0]) for f in files}
        missing = [name for name, _ in gathered if canonical(name) not in names]
        if missing or len(files) != len(gathered):
            fail(f"pip download did not bring one wheel each of: {', '.join(missing) or gathered}")
        pack(files, dest, part_bytes)


def pack(files: list[Path], dest: Path, part_bytes: int) -> None:
    """Wheels into dest/partN folders of at most part_bytes each (manifest included in each);
    a wheel larger than a part is cut into equal pieces first (NAME.whl.000, .001, ...)."""
    room = part_bytes - 200_000   # the manifest
    pieces = []   # (size, wheel, its piece count, piece index, offset)
    for wheel in files:
        size = wheel.stat().st_size
        count = max(1, math.ceil(size / room))
        step = math.ceil(size / count)
        pieces += [(min(step, size - offset), wheel, count, index, offset)
                   for index, offset in enumerate(range(0, size, step))]
    loads: list[int] = []
    placed = []   # (part number, piece)
    for piece in sorted(pieces, key=lambda piece: (-piece[0], piece[1].name, piece[3])):
        part = next((p for p, load in enumerate(loads) if load + piece[0] <= room), None)
        if part is None:
            loads.append(0)
            part = len(loads) - 1
        loads[part] += piece[0]
        placed.append((part + 1, piece))
    shutil.rmtree(dest, ignore_errors=True)
    manifest: dict = {"python": PYTHON, "parts": len(loads), "wheels": {}}
    for part, (size, wheel, count, index, offset) in sorted(
            placed, key=lambda placed: (placed[1][1].name, placed[1][3])):
        entry = manifest["wheels"].setdefault(wheel.name, {
            "sha256": sha256(wheel), "size": wheel.stat().st_size, "pieces": []})
        name = wheel.name if count == 1 else f"{wheel.name}.{index:03d}"
        folder = dest / f"part{part}"
        folder.mkdir(parents=True, exist_ok=True)
        with open(wheel, "rb") as source, open(folder / name, "wb") as sink:
            source.seek(offset)
            sink.write(source.read(size))
        entry["pieces"].append([part, name])
    text = json.dumps(manifest, indent=1, sort_keys=True)
    for part in range(1, len(loads) + 1):
        (dest / f"part{part}" / MANIFEST).write_text(text)
    total = sum(entry["size"] for entry in manifest["wheels"].values())
    say(f"{len(manifest['wheels'])} wheels, {total / 1e6:.1f} MB, in {len(loads)} part(s) of "
        f"at most {part_bytes / 1e6:.0f} MB each:")
    for part in range(1, len(loads) + 1):
        folder = dest / f"part{part}"
        size = sum(f.stat().st_size for f in folder.iterdir())
        shown = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
        say(f"  {shown}: {size / 1e6:.1f} MB")


# ------------------------------------------------------------------------------ install

def read_manifest(folder: Path) -> dict:
    manifests = sorted(folder.glob(f"part*/{MANIFEST}"))
    if not manifests:
        fail(f"no wheel parts in {folder} (make gpu-wheels on a machine with a package index, "
             f"then copy {folder}/part1, part2, ... here)")
    texts = {m.read_text() for m in manifests}
    if len(texts) != 1:
        fail(f"the parts in {folder} come from different runs of gpu-wheels: copy one run's")
    manifest = json.loads(texts.pop())
    absent = [f"part{n}" for n in range(1, manifest["parts"] + 1)
              if not (folder / f"part{n}" / MANIFEST).is_file()]
    if absent:
        fail(f"{folder} lacks {', '.join(absent)} of {manifest['parts']} parts: copy them too")
    return manifest


def join(folder: Path, manifest: dict) -> list[Path]:
    """The whole wheels in folder/joined, each checked against its sha256."""
    joined = folder / "joined"
    joined.mkdir(exist_ok=True)
    paths = []
    for name, entry in sorted(manifest["wheels"].items()):
        path = joined / name
        if not (path.is_file() and path.stat().st_size == entry["size"]
                and sha256(path) == entry["sha256"]):
            with open(path, "wb") as sink:
                for part, piece in entry["pieces"]:
                    with open(folder / f"part{part}" / piece, "rb") as source:
                        shutil.copyfileobj(source, sink, 1 << 20)
            if sha256(path) != entry["sha256"]:
                path.unlink()
                fail(f"{name}: joined from its pieces, it does not match its sha256 (a part was "
                     "damaged or is from another run: copy it again)")
        paths.append(path)
    return paths


def state_digest(manifest: dict) -> str:
    """What the environment is made from: the wheels and the project's build description."""
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode())
    for path in [ROOT / "pyproject.toml", ROOT / "setup.py", *sorted(ROOT.glob("csrc/*.c"))]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{PYTHON}" / "site-packages"


_CHECK = """
import json, sys
from speechlens_cli import runtime
runtime.prepare()  # the optimized BLAS before mlx.core
import mlx.core as mx
from speechlens_cli import blas
print(json.dumps({"cuda": mx.cuda.is_available(), "device": str(mx.default_device()),
                  "blas": blas.loaded, "blas_status": blas.status}))
"""


def _check(python: Path) -> dict | None:
    done = subprocess.run([str(python), "-c", _CHECK], capture_output=True, text=True,
                          cwd=ROOT, env=test_environment(python.parent.parent), check=False)
    if done.returncode != 0:
        say("MLX did not load: " + (done.stderr.strip().splitlines() or ["?"])[-1])
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _host_cuda_libraries() -> Path | None:
    """The host Python's `nvidia` package folder (its CUDA library wheels), if it has one."""
    spec = importlib.util.find_spec("nvidia")
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location)
        if any((folder / sub / "lib").is_dir() for sub in ("cu13", "cublas", "cudnn")):
            return folder
    return None


def install(folder: Path, venv: Path, force: bool = False) -> None:
    manifest = read_manifest(folder)
    if sys.version_info[:2] != tuple(map(int, PYTHON.split("."))):
        fail(f"the wheels are for CPython {PYTHON}; this is {sys.version.split()[0]} "
             f"({sys.executable}): run with python{PYTHON}")
    digest = state_digest(manifest)
    stamp = venv / STAMP
    if not force and stamp.is_file() and stamp.read_text() == digest \
            and venv_python(venv).exists():
        say(f"{venv} is up to date")
        return
    started = time.monotonic()
    missing = [tool for tool in ("gcc", "g++") if shutil.which(tool) is None]
    if missing:
        fail(f"{' and '.join(missing)} not found: setup.py compiles the CPU kernel library (C++) "
             "and the BLAS shim (C) that the tests need")
    paths = join(folder, manifest)
    pip_wheel = next((p for p in paths if canonical(p.name.split("-")[0]) == "pip"), None)
    if pip_wheel is None:
        fail("no pip wheel among the parts")
    say(f"making {venv} with {sys.executable} ({sys.version.split()[0]})")
    run([sys.executable, "-m", "venv", "--clear", "--without-pip", venv])
    python = venv_python(venv)
    quiet = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
             "PIP_NO_INPUT": "1", "PIP_NO_WARN_SCRIPT_LOCATION": "1"}
    quiet.pop("PYTHONPATH", None)
    offline = ["install", "--quiet", "--no-index", "--no-deps"]
    run([python, f"{pip_wheel}/pip", *offline, pip_wheel], env=quiet)
    run([python, "-m", "pip", *offline, *[p for p in paths if p != pip_wheel]], env=quiet)
    say("installing the project (editable; setup.py compiles its libraries)")
    run([python, "-m", "pip", *offline, "--no-build-isolation", "--editable", ROOT], env=quiet)
    suffix = subprocess.run([str(python), "-c", "import sysconfig; "
                             "print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    for library in ("_cpu_kernels", "_blas_shim"):
        if not (ROOT / "speechlens_cli" / f"{library}{suffix}").is_file():
            fail(f"setup.py did not build speechlens_cli/{library}{suffix}: "
                 "are gcc and g++ working?")
    for script in ("speechlens", "mlx.launch"):
        if not (venv / "bin" / script).is_file():
            fail(f"{venv}/bin/{script} was not installed")
    problems = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True,
                              text=True, env=quiet, check=False).stdout.splitlines()
    real = [line for line in problems
            if not re.search(r"requires (nvidia-[\w-]+)", line) and "No broken" not in line]
    if real:
        fail("pip check: " + "; ".join(real))
    facts = _check(python)
    if facts is None or not facts["cuda"]:
        host = _host_cuda_libraries()
        link = site_packages(venv) / "nvidia"
        if host is not None and not link.exists():
            say(f"pointing MLX at the host's CUDA libraries: {link} -> {host}")
            link.symlink_to(host, target_is_directory=True)
            facts = _check(python)
    if facts is None:
        fail("MLX cannot be imported in the new environment (see the line above)")
    if not facts["cuda"]:
        if os.environ.get(CPU_OK_ENV) != "1":
            fail(f"MLX sees no CUDA GPU here (default device {facts['device']}); set "
                 f"{CPU_OK_ENV}=1 to go on without one")
        say(f"no CUDA GPU: going on without one ({CPU_OK_ENV}=1)")
    if not facts["blas"]:
        fail(f"no optimized BLAS: {facts['blas_status']}")
    stamp.write_text(digest)
    say(f"installed in {time.monotonic() - started:.0f} s: MLX default device {facts['device']}, "
        f"BLAS {facts['blas']}; {venv}/bin has speechlens and mlx.launch")


# ------------------------------------------------------------------------------ test

def test_environment(venv: Path) -> dict:
    """The environment's Python and scripts first, none of the host's packages."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VIRTUAL_ENV": str(venv.resolve())}
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    env["PATH"] = f"{venv.resolve() / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def part_files(part: str) -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix()
                  for p in (ROOT / "tests").glob(PARTS[part][1]))


def summary(xml: Path) -> dict:
    tree = ElementTree.parse(xml).getroot()
    suites = [tree] if tree.tag == "testsuite" else list(tree.iter("testsuite"))
    count = {key: sum(int(s.get(key, 0)) for s in suites)
             for key in ("tests", "failures", "errors", "skipped")}
    count["time"] = sum(float(s.get("time", 0)) for s in suites)
    count["passed"] = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
    return count


def test(part: str, venv: Path, results: Path, pytest_args: list[str]) -> int:
    if part == "all":
        codes = [test(p, venv, results, pytest_args) for p in PARTS]
        return next((code for code in codes if code), 0)
    if part not in PARTS:
        fail(f"no part {part!r}: the parts are {', '.join(PARTS)} and all")
    python = venv_python(venv)
    if not (venv / STAMP).is_file():
        fail(f"no environment at {venv}: run `make gpu-install` (or this script's install) first")
    results.mkdir(parents=True, exist_ok=True)
    xml, log = results / f"part{part}.xml", results / f"part{part}.log"
    marker = PARTS[part][0]
    command = [str(python), "-m", "pytest", "-v", "-m", marker, "--junitxml", str(xml),
               "-o", "junit_family=xunit2", "--durations=15", *pytest_args, *part_files(part)]
    say(f"part {part} ({marker}, {PARTS[part][1]}): " + " ".join(command[1:]))
    started = time.monotonic()
    with open(log, "w") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=test_environment(venv),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in process.stdout:
            sys.stdout.write(line)
            sink.write(line)
        code = process.wait()
    seconds = time.monotonic() - started
    if code == 5:   # nothing selected
        code = 0
    if xml.is_file():
        c = summary(xml)
        line = (f"part {part}: {c['passed']} passed, {c['failures']} failed, {c['errors']} "
                f"errors, {c['skipped']} skipped in {seconds:.0f} s (pytest exit {code})")
    else:
        line = f"part {part}: no report (pytest exit {code}) after {seconds:.0f} s"
    with open(results / "summary.txt", "a") as sink:
        sink.write(line + "\n")
    say(line)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gather = commands.add_parser("wheels", help="gather the host's wheels (needs an index)")
    gather.add_argument("--dest", type=Path, default=ROOT / ".wheels")
    gather.add_argument("--part-bytes", type=int, default=PART_BYTES)
    setup = commands.add_parser("install", help="make the environment on the host")
    setup.add_argument("--wheels", type=Path, default=ROOT / ".wheels")
    setup.add_argument("--venv", type=Path, default=ROOT / ".gpu-venv")
    setup.add_argument("--force", action="store_true", help="remake it even if up to date")
    check = commands.add_parser("test", help="run one part of the suite there")
    check.add_argument("part", help=f"{', '.join(PARTS)} or all")
    check.add_argument("--venv", type=Path, default=ROOT / ".gpu-venv")
    check.add_argument("--results", type=Path, default=ROOT / ".gpu-results")
    check.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    commands.add_parser("parts", help="list the parts of the suite")
    args = parser.parse_args(argv)
    if args.command == "wheels":
        wheels(args.dest.resolve(), args.part_bytes)
    elif args.command == "install":
        install(args.wheels.resolve(), args.venv.absolute(), args.force)
    elif args.command == "test":
        return test(args.part, args.venv.absolute(), args.results.resolve(), args.pytest_args)
    else:
        for part, (marker, pattern) in PARTS.items():
            print(f"{part}: -m '{marker}' tests/{pattern}: {len(part_files(part))} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
