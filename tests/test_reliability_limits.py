"""Reliability: memory limits, launcher variables, settings from the environment
(docs/reliability.md)."""

from __future__ import annotations

import pytest

from tests.reliability import (
    invoke,
    leftovers,
    make_audio,
    one_error_line,
)


# ------------------------------------------------------------------------------ failures in MLX

#: name -> (what the model raised, whether shorter windows are the advice)
MODEL_FAILURES = {
    "mlx-malloc": (RuntimeError("[malloc] Unable to allocate 4294967296 bytes."), True),
    "metal-out-of-memory": (RuntimeError("[METAL] Command buffer execution failed: Insufficient "
                                         "Memory (00000008:kIOGPUCommandBufferCallbackErrorOut"
                                         "OfMemory)"), True),
    "memory-error": (MemoryError(), True),
    "value-error": (ValueError("invalid literal for int() with base 10: '²'"), False),
    "runtime-error": (RuntimeError("[conv] Invalid input shape"), False),
}


@pytest.mark.parametrize("name", sorted(MODEL_FAILURES))
def test_only_a_failed_allocation_suggests_shorter_windows(tmp_path, tiny_checkpoint,
                                                         monkeypatch, name):
    """Every failure in the model said "shorter windows (--chunk-seconds) need less memory":
    a bad SPEECHLENS_CPU_THREADS too. Now only a failed allocation does; any failure is one
    line, exit 1, nothing written."""
    from speechlens_cli.model.semamba import SEMamba

    error, about_memory = MODEL_FAILURES[name]

    def fail(*_args, **_kwargs):
        raise error
    monkeypatch.setattr(SEMamba, "enhance", fail)
    result = invoke("enhance", make_audio(tmp_path / "a.wav"), tmp_path / "out.wav",
                    "--model", tiny_checkpoint)
    assert result.exit_code == 1, result.output
    line = one_error_line(result.stderr)
    assert "a.wav: the model failed on 400 samples at 8000 Hz (" in line, line
    assert ("shorter windows (--chunk-seconds) need less memory" in line) == about_memory, line
    assert not (tmp_path / "out.wav").exists() and not leftovers(tmp_path)


# ------------------------------------------------------------------------------ CPU threads

@pytest.mark.parametrize("value", ["٣", "３", "²"])
def test_a_thread_count_in_other_digits_is_a_usage_error(tmp_path, tiny_checkpoint, monkeypatch,
                                                         value, on_cpu):
    """SPEECHLENS_CPU_THREADS of Arabic-Indic or fullwidth digits passed (int() reads them), a
    superscript two failed as "the model failed ... shorter windows need less memory" and
    `doctor` raised a traceback. Now ASCII digits only: one line naming the variable, exit 2;
    doctor says how to fix it."""
    monkeypatch.setenv("SPEECHLENS_CPU_THREADS", value)
    result = invoke("enhance", make_audio(tmp_path / "a.wav"), tmp_path / "out.wav",
                    "--model", tiny_checkpoint, "--device", "cpu")
    assert result.exit_code == 2, result.output
    line = one_error_line(result.stderr)
    assert f"SPEECHLENS_CPU_THREADS must be a whole number of threads (1 or more), got " \
           f"{value!r}" in line, line
    assert not (tmp_path / "out.wav").exists() and not leftovers(tmp_path)
    doctor = invoke("doctor", "--model", tiny_checkpoint)
    assert doctor.exit_code == 1, doctor.output
    assert "fix: unset SPEECHLENS_CPU_THREADS or set it to a thread count" in doctor.output
    assert "Traceback" not in doctor.output
