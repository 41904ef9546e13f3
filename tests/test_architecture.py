"""Layers only point down: CLI/tools -> API/pipeline -> checkpoint/audio -> model -> kernels.

The same rule holds one level down, inside each package (SUBLAYERS); the kernels' build
description stays loadable without the package (setup.py runs before it is installed), and
nothing in the package reaches into the checkout's tests or fixtures, and only one module uses
soundfile's internals.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "speechlens_cli"

# Lower numbers are lower layers; a module may import its own layer or any lower one.
LAYERS = {
    "errors": 0, "settings": 0, "blas": 0, "heap": 0, "runtime": 0, "kernels": 0, "results": 0,
    "model": 1, "hub": 1,
    "checkpoint": 2, "audio": 2, "synthetic": 2,
    "pipeline": 3, "conveyor": 3, "api": 3, "scoring": 3, "report": 3,
    "cli": 4, "bench": 4, "kernel_bench": 4, "distributed": 4, "__main__": 4, "__init__": 4,
}

# Inside a package: lower numbers are lower sub-layers; a module imports its own or lower ones.
SUBLAYERS = {
    "kernels": {"build": 0, "notices": 0, "contract": 0, "scratch": 0, "sources": 1, "fallback": 1,
                "compiler": 2, "nvrtc": 2, "gpu": 2, "cuda_packed": 3, "cpu_binding": 3,
                "selfcheck": 3, "cuda_projection": 4, "cuda_conv2d": 5, "cpu_ops": 4, "dispatch": 6,
                "__init__": 7},
    "audio": {"libsndfile": 0, "pyav": 0, "containers": 0, "info": 0, "media": 1, "formats": 1,
              "read": 2, "write": 2, "stdin": 3, "tree": 3, "__init__": 5},
    "model": {"config": 0, "stft": 0, "scheduling": 0, "layers": 1, "mamba": 2,
              "long_windows": 2, "encoder_decoders": 2, "semamba": 3, "layout": 4, "__init__": 5},
    "cli": {"app": 0, "license": 0, "interrupts": 0, "speed": 0, "jobs": 1, "reporting": 1,
            "before_after": 1, "runner": 2, "demo": 3, "models": 3, "doctor": 3, "enhance": 3,
            "formats": 3, "score": 3, "__init__": 4},
    "scoring": {"extra": 0, "speech": 1, "dnsmos": 2, "reference_metrics": 2, "__init__": 3},
    "report": {"scores": 0, "excerpt": 0, "pictures": 1, "page": 1, "pages": 2, "__init__": 3},
    "distributed": {"plan": 0, "collectives": 0, "share": 1, "launcher": 2, "__init__": 3},
    "checkpoint": {"locate": 0, "validate": 1, "load": 2, "__init__": 3},
}
#: Loaded by path from setup.py, before speechlens (and MLX) is installed: standard library only.
STANDALONE = ("kernels", "build")
#: The one module allowed to use soundfile's private cffi handles.
SOUNDFILE_INTERNALS = ("audio", "libsndfile.py")
#: Checkout folders that an installed speechlens does not have.
CHECKOUT_ONLY = ("fixtures", "tests", "reference")


def _layer(module: str) -> int:
    """Layer of a dotted module path inside the package, e.g. 'model.stft' or 'bench.runner'."""
    top = module.split(".")[0]
    if top not in LAYERS:
        raise AssertionError(f"speechlens_cli.{module} has no layer in tests/test_architecture.py")
    return LAYERS[top]


def _imports(source: str, parts: tuple[str, ...]) -> set[str]:
    """Package-internal modules imported by one file (at `parts` below speechlens_cli)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".", 1)[1] for a in node.names
                         if a.name.startswith("speechlens_cli."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(parts[: len(parts) - node.level])
            elif node.module and node.module.startswith("speechlens_cli"):
                base, node.module = [], node.module.partition(".")[2] or None
            else:
                continue
            if node.module:
                found.add(".".join(base + node.module.split(".")))
            else:
                found.update(".".join(_module_or_package(base, a.name)) for a in node.names)
    return found


def _module_or_package(base: list[str], name: str) -> list[str]:
    """`from base import name`: the submodule `name` if it exists, else base's own __init__."""
    candidate = PACKAGE.joinpath(*base, name)
    if candidate.with_suffix(".py").is_file() or candidate.is_dir():
        return base + [name]
    return base + ["__init__"] if base else ["__init__"]


def _violations(source: str, parts: tuple[str, ...]) -> list[str]:
    module = ".".join(parts)
    own = _layer(module)
    return [f"{module} (layer {own}) imports {imported} (layer {_layer(imported)})"
            for imported in sorted(_imports(source, parts)) if _layer(imported) > own]


def _sublayer(package: str, module: str) -> int:
    if module not in SUBLAYERS[package]:
        raise AssertionError(
            f"speechlens_cli.{package}.{module} has no sub-layer in tests/test_architecture.py")
    return SUBLAYERS[package][module]


def _sub_violations(source: str, parts: tuple[str, ...]) -> list[str]:
    """Imports inside one package that point to a higher sub-layer of it."""
    if len(parts) != 2 or parts[0] not in SUBLAYERS:
        return []
    package, module = parts
    own = _sublayer(package, module)
    inside = {imported.split(".")[1] for imported in _imports(source, parts)
              if imported.split(".")[0] == package and "." in imported}
    return [f"{package}.{module} (sub-layer {own}) imports {package}.{name} "
            f"(sub-layer {_sublayer(package, name)})"
            for name in sorted(inside) if _sublayer(package, name) > own]


def _top_level_imports(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add("." if node.level else (node.module or "").split(".")[0])
    return found


def test_every_module_imports_only_its_layer_or_below():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        violations += _violations(path.read_text(), path.relative_to(PACKAGE).with_suffix("").parts)
    assert not violations, "\n".join(violations)


def test_inside_a_package_modules_import_only_their_sub_layer_or_below():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        violations += _sub_violations(path.read_text(), parts)
    assert not violations, "\n".join(violations)


def test_the_build_description_needs_only_the_standard_library():
    source = PACKAGE.joinpath(*STANDALONE).with_suffix(".py").read_text()
    foreign = sorted(name for name in _top_level_imports(source)
                     if name != "__future__" and name not in sys.stdlib_module_names)
    assert not foreign, f"speechlens_cli/{'/'.join(STANDALONE)}.py imports {foreign}"


def test_nothing_in_the_package_imports_the_checkout():
    found = [f"{path.relative_to(PACKAGE)} imports {name}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for name in sorted(_top_level_imports(path.read_text()) & set(CHECKOUT_ONLY))]
    assert not found, "\n".join(found)


def test_only_audio_libsndfile_reaches_into_soundfile_internals():
    """soundfile's cffi handles are not its API: one module may use them, where a release that
    drops them is noticed at once."""
    private = re.compile(r"\bsf\._|[\"']_(?:snd|ffi)[\"']|\._file\b")
    found = [str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(PACKAGE) != Path(*SOUNDFILE_INTERNALS)
             and private.search(path.read_text())]
    assert not found, f"soundfile internals used outside audio/libsndfile.py: {found}"


def test_the_checker_flags_an_upward_import():
    assert _violations("from ..cli import main\n", ("model", "semamba")) == [
        "model.semamba (layer 1) imports cli (layer 4)"]
    assert _violations("from speechlens_cli import pipeline\n", ("kernels",)) == [
        "kernels (layer 0) imports pipeline (layer 3)"]
    assert _violations("from .config import ModelConfig\n", ("model", "layout")) == []
    assert _sub_violations("from .dispatch import backend\n", ("kernels", "gpu")) == [
        "kernels.gpu (sub-layer 2) imports kernels.dispatch (sub-layer 6)"]
    assert _sub_violations("from .build import CPU_SOURCES\n", ("kernels", "compiler")) == []


def test_readme_layout_names_every_module():
    """README's layout table names every package and module of speechlens_cli (a module by its
    name in backticks, a package by its folder), so a newcomer's map matches the tree."""
    readme = (PACKAGE.parent / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        relative = path.relative_to(PACKAGE)
        if len(relative.parts) == 1:
            named = f"`speechlens_cli/{path.name}`" in layout or f"`{path.stem}`" in layout
        else:
            named = f"speechlens_cli/{relative.parts[0]}/" in layout and f"`{path.stem}`" in layout
        if not named:
            missing.append(str(relative))
    assert not missing, missing
