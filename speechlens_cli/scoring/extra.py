"""The `report` extra: the packages scoring and reports need, imported only when asked for, and
one line naming the install command when one of them is missing or broken."""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType

from ..errors import MissingExtraError

INSTALL = "pip install 'speechlens[report]'"
#: Import name -> distribution name of every package scoring and `enhance --report` use.
PACKAGES = {"onnxruntime": "onnxruntime", "speechmos": "speechmos", "soxr": "soxr",
            "pesq": "pesq", "pystoi": "pystoi", "matplotlib": "matplotlib"}
#: What DNSMOS needs, what scores against a reference add (pystoi's scipy alone takes longer
#: to import than DNSMOS takes to score a 5-s file, so it is imported only when asked for), and
#: what a report's pictures add.
DNSMOS = ("onnxruntime", "speechmos", "soxr")
REFERENCE = ("pesq", "pystoi")
PICTURES = ("matplotlib",)


def load(name: str) -> ModuleType:
    """The module `name` of the extra, or the one-line error saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise MissingExtraError(f"scoring needs {PACKAGES[name]}, which "
                                f"{_why(name, error)}: {INSTALL}") from None


def _why(name: str, error: ImportError) -> str:
    if isinstance(error, ModuleNotFoundError) and error.name == name:
        return "is not installed"
    return f"cannot be imported ({error})"


def require(names: tuple[str, ...] = tuple(PACKAGES)) -> None:
    """These packages of the extra (default: all) importable, checked before any file is read."""
    for name in names:
        load(name)


def versions() -> dict[str, str | None]:
    """Distribution -> installed version (None: not installed), without importing any."""
    found = {}
    for distribution in PACKAGES.values():
        try:
            found[distribution] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            found[distribution] = None
    return found
