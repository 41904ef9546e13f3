"""Layers only point down: CLI/tools -> API/pipeline -> checkpoint/audio -> model -> kernels."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "speechlens_cli"

# Lower numbers are lower layers; a module may import its own layer or any lower one.
LAYERS = {
    "errors": 0, "blas": 0, "kernels": 0, "results": 0,
    "model": 1,
    "checkpoint": 2, "audio": 2,
    "pipeline": 3, "api": 3,
    "cli": 4, "bench": 4, "kernel_bench": 4, "distributed": 4, "__main__": 4, "__init__": 4,
}


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


def test_every_module_imports_only_its_layer_or_below():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        violations += _violations(path.read_text(), path.relative_to(PACKAGE).with_suffix("").parts)
    assert not violations, "\n".join(violations)


def test_the_checker_flags_an_upward_import():
    assert _violations("from ..cli import main\n", ("model", "semamba")) == [
        "model.semamba (layer 1) imports cli (layer 4)"]
    assert _violations("from speechlens_cli import pipeline\n", ("kernels",)) == [
        "kernels (layer 0) imports pipeline (layer 3)"]
    assert _violations("from .config import ModelConfig\n", ("model", "layout")) == []
