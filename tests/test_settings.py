"""The environment variables: declared once (speechlens_cli/settings.py), one rule for every
switch, a bad value one SettingError naming its variable, README's table and `doctor` from the
declaration, and no variable of speechlens' own read or named anywhere without it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from speechlens_cli import kernels, settings
from speechlens_cli.settings import SettingError
from tests.reliability import invoke

REPO = Path(__file__).resolve().parents[1]
SWITCHES = [s for s in settings.ALL if s.expects == "1, true, yes or on, or 0, false, no or off"]


def test_readme_table_is_the_declaration():
    """README's Settings table lists every declared variable, in order, as declared."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    rows = [line for line in readme.split("## Settings", 1)[1].split("\n## ", 1)[0].splitlines()
            if line.startswith("| `")]
    assert rows == [f"| `{s.name}` | {s.expects} | {s.help} |" for s in settings.ALL]


def test_every_variable_of_speechlens_is_declared():
    """A SPEECHLENS_ name anywhere in the package (a read, a message, a docstring) is one of
    settings.ALL, and each is declared once."""
    declared = [s.name for s in settings.ALL]
    assert len(declared) == len(set(declared))
    named = {name for path in (REPO / "speechlens_cli").rglob("*.py")
             for name in re.findall(r"\bSPEECHLENS_[A-Z0-9][A-Z0-9_]*", path.read_text("utf-8"))}
    assert named <= set(declared), named - set(declared)


def test_no_module_reads_a_declared_variable_itself():
    """os.environ / os.getenv with a declared name appear only in settings.py (launchers and
    the bench may still write them for a child process)."""
    names = "|".join(re.escape(s.name) for s in settings.ALL)
    read = re.compile(rf"(environ\.get|getenv)\(\s*[\"']({names})[\"']")
    for path in (REPO / "speechlens_cli").rglob("*.py"):
        if path.name != "settings.py":
            assert not read.search(path.read_text("utf-8")), path


#: Other programs' variables speechlens reads (declared, never refused).
EXTERNAL = ("HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT", "HF_HUB_OFFLINE", "XDG_CACHE_HOME",
            "XDG_DATA_HOME", "CXX", "CUDA_HOME", "CUDA_PATH", "FORCE_COLOR", "TTY_COMPATIBLE")


def test_every_variable_read_is_declared():
    """Any variable a module reads by name (os.environ.get, os.getenv, setdefault, `in
    os.environ`), the project's or another program's, is declared in settings.ALL: its own
    (SPEECHLENS_*, MLX_*) and the others it reads (Hugging Face's, XDG, CXX, CUDA, Rich)."""
    declared = {s.name for s in settings.ALL}
    assert set(EXTERNAL) <= declared
    read = re.compile(r"(?:environ\.get|getenv|environ\.setdefault)\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']"
                      r"|[\"']([A-Z][A-Z0-9_]*)[\"']\s+(?:not\s+)?in\s+os\.environ")
    named = {a or b for path in (REPO / "speechlens_cli").rglob("*.py")
             for a, b in read.findall(path.read_text("utf-8"))}
    assert named <= declared, named - declared


def test_other_programs_variables_are_never_refused(monkeypatch):
    """HF_*, XDG_*, CXX, CUDA_*, FORCE_COLOR: their owners read them; doctor never counts them
    as a problem, and HF_HUB_OFFLINE is on as huggingface_hub spells it."""
    odd = {name: " \u00b2 odd value " for name in EXTERNAL}
    assert settings.problems(odd) == []
    for text, on in [("1", True), (" YES ", True), ("on", True), ("0", False), ("2", False),
                     ("", False)]:
        assert settings.HF_HUB_OFFLINE.value({"HF_HUB_OFFLINE": text}) is on, text
    monkeypatch.setenv("HF_ENDPOINT", " http://x ")
    assert settings.HF_ENDPOINT.raw() == " http://x "   # as huggingface_hub reads it


def test_the_switches():
    assert [s.name for s in SWITCHES] == [
        "SPEECHLENS_ACCEPT_LICENSE", "SPEECHLENS_CUDA_PROJECTION", "SPEECHLENS_CUDA_PROJECT_CONV",
        "SPEECHLENS_CUDA_CONV2D", "SPEECHLENS_DISABLE_METAL_CONV1D",
        "SPEECHLENS_DISABLE_CONV1D_KERNEL"]


@pytest.mark.parametrize("setting", SWITCHES, ids=lambda s: s.name)
def test_one_rule_for_every_switch(monkeypatch, setting):
    for text, on in [("1", True), ("TRUE", True), (" yes ", True), ("On", True),
                     ("0", False), ("false", False), ("No", False), ("OFF", False)]:
        monkeypatch.setenv(setting.name, text)
        assert setting.value() is on, text
    for blank in ("", "  "):
        monkeypatch.setenv(setting.name, blank)
        assert setting.value() is setting.default
    monkeypatch.delenv(setting.name)
    assert setting.value() is setting.default
    monkeypatch.setenv(setting.name, "2")
    with pytest.raises(SettingError, match=f"^{setting.name} must be ") as refused:
        setting.value()
    assert refused.value.setting is setting and refused.value.exit_code == 2


def test_mlx_enable_tf32_is_read_as_mlx_reads_it(monkeypatch):
    """MLX reads it with atoi, on when unset: "true" would be off there, so it is refused."""
    monkeypatch.delenv("MLX_ENABLE_TF32", raising=False)
    assert settings.TF32.value() is True
    for text, on in [("1", True), ("2", True), ("0", False), ("", False), ("-0", False)]:
        monkeypatch.setenv("MLX_ENABLE_TF32", text)
        assert settings.TF32.value() is on, text
    for text in ("true", "off", "1.5"):
        monkeypatch.setenv("MLX_ENABLE_TF32", text)
        with pytest.raises(SettingError, match="MLX_ENABLE_TF32 must be an integer"):
            settings.TF32.value()


def test_a_count_and_a_choice(monkeypatch):
    for text in ("0", "abc", "-3", "2.5", "\u0663", "\uff13"):
        monkeypatch.setenv("SPEECHLENS_CPU_THREADS", text)
        with pytest.raises(SettingError, match="whole number of threads"):
            settings.CPU_THREADS.value()
    monkeypatch.setenv("SPEECHLENS_CPU_THREADS", "9" * 5000)
    assert settings.CPU_THREADS.value() >= 10**18
    monkeypatch.setenv("SPEECHLENS_CPU_ISA", " AVX2 ")
    assert settings.CPU_ISA.value() == "avx2"


def test_cpu_isa_names_are_the_builds():
    assert set(settings.CPU_ISA_NAMES) == set(kernels.CPU_ISA_CHOICES)


def test_a_launcher_environment_is_read_the_same_way():
    """value(env) reads a mapping other than os.environ (a launcher's)."""
    assert settings.JOIN_TIMEOUT_S.value({}) == 60.0
    assert settings.JOIN_TIMEOUT_S.value({"SPEECHLENS_JOIN_TIMEOUT_S": "2.5"}) == 2.5
    for text in ("nan", "inf", "0", "86401", "\u0662"):
        with pytest.raises(SettingError):
            settings.JOIN_TIMEOUT_S.value({"SPEECHLENS_JOIN_TIMEOUT_S": text})


def test_a_launchers_leftovers_are_never_refused():
    """Launcher variables left in a shell must not stop a run alone: a value that names no
    rank or size reads as none."""
    leftovers = {"MLX_RANK": "\u00b2", "MLX_WORLD_SIZE": "\u0663", "PMI_SIZE": "many",
                 "OMPI_COMM_WORLD_RANK": "9" * 13, "MLX_HOSTFILE": " "}
    assert settings.problems(leftovers) == []
    assert [settings.MLX_RANK.value(leftovers), settings.MLX_WORLD_SIZE.value(leftovers),
            settings.PMI_SIZE.value(leftovers), settings.OMPI_RANK.value(leftovers),
            settings.MLX_HOSTFILE.value(leftovers)] == [None] * 5
    assert settings.PMI_RANK.value({"PMI_RANK": " 3 "}) == 3


def test_doctor_reports_a_bad_setting_from_its_declaration(monkeypatch, tiny_checkpoint):
    monkeypatch.setenv("SPEECHLENS_CUDA_CONV2D", "maybe")
    result = invoke("doctor", "--json", "--model", tiny_checkpoint)
    check = json.loads(result.output)["checks"]["settings"]
    assert result.exit_code == 1 and not check["ok"]
    assert check["value"].startswith("SPEECHLENS_CUDA_CONV2D must be 1, true, yes or on")
    assert check["fix"] == ("unset SPEECHLENS_CUDA_CONV2D or set it to "
                            f"{settings.CUDA_CONV2D.expects}")
    monkeypatch.setenv("SPEECHLENS_CUDA_CONV2D", "off")
    check = json.loads(invoke("doctor", "--json", "--model", tiny_checkpoint).output)
    assert check["checks"]["settings"]["ok"]
    assert "SPEECHLENS_CUDA_CONV2D=off" in check["checks"]["settings"]["value"].split(", ")


def test_one_bad_value_is_one_problem(monkeypatch, tiny_checkpoint, on_cpu):
    """A bad SPEECHLENS_CPU_THREADS, which the kernels read too, is the settings check's
    problem only: doctor counts it once, and the kernels check says where to look."""
    monkeypatch.delenv("SPEECHLENS_CPU_THREADS", raising=False)
    good = json.loads(invoke("doctor", "--json", "--model", tiny_checkpoint).output)
    monkeypatch.setenv("SPEECHLENS_CPU_THREADS", "abc")
    bad = json.loads(invoke("doctor", "--json", "--model", tiny_checkpoint).output)
    assert bad["problems"] == good["problems"] + 1
    assert not bad["checks"]["settings"]["ok"]
    assert bad["checks"]["kernels"]["ok"]
    assert "SPEECHLENS_CPU_THREADS" in bad["checks"]["kernels"]["value"]
    assert bad["checks"]["kernels"]["value"].endswith("(see settings)")
