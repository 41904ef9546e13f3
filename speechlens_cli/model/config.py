"""Model configuration, read from the checkpoint's config.json."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import IncompatibleModelError
from ..kernels.build import CONV_WIDTH, D_STATE

SUPPORTED_SAMPLE_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 192000
#: Largest n_fft at the base rate (the official model's is 320 at 8 kHz, scaled with the rate).
MAX_BASE_N_FFT = 4096
#: Smallest hop as a fraction of n_fft (the official model's is n_fft/8).
MAX_HOP_DIVISOR = 32
#: config.json's integer fields, each with the section it is in.
INT_FIELDS = (
    ("num_tfmamba", "model_cfg"), ("hid_feature", "model_cfg"), ("d_state", "model_cfg"),
    ("d_conv", "model_cfg"), ("expand", "model_cfg"), ("input_channel", "model_cfg"),
    ("output_channel", "model_cfg"), ("n_fft", "stft_cfg"), ("hop_size", "stft_cfg"),
    ("win_size", "stft_cfg"), ("sampling_rate", "stft_cfg"),
)
#: The fields that set a model's size, and so its speed: reports and speed estimates name a
#: model by them.
SIZE_FIELDS = ("num_tfmamba", "hid_feature", "d_inner", "d_state")


def _make_even(value: int) -> int:
    return value + 1 if value % 2 else value


@dataclass(frozen=True)
class StftParams:
    n_fft: int
    hop: int
    win: int

    @property
    def n_bins(self) -> int:
        return self.n_fft // 2 + 1


@dataclass(frozen=True)
class ModelConfig:
    """A RE-USE configuration; the defaults are the official full-size model's, the one place
    its numbers are written (the synthetic checkpoints, the benchmark and the tests take them
    from here)."""

    num_tfmamba: int = 30
    hid_feature: int = 64
    d_state: int = 16
    d_conv: int = 4
    expand: int = 4
    input_channel: int = 2
    output_channel: int = 1
    norm_epsilon: float = 1e-5
    compress_factor: str = "relu_log1p"
    n_fft: int = 320
    hop_size: int = 40
    win_size: int = 320
    sampling_rate: int = 8000
    sfi: bool = True

    @property
    def d_inner(self) -> int:
        return self.expand * self.hid_feature

    @property
    def dt_rank(self) -> int:
        return math.ceil(self.hid_feature / 16)

    def size(self) -> dict[str, int]:
        """The SIZE_FIELDS and their values."""
        return {name: getattr(self, name) for name in SIZE_FIELDS}

    def to_dict(self) -> dict:
        """config.json's form of this configuration, which from_dict reads back."""
        out: dict = {"model_cfg": {}, "stft_cfg": {}}
        for name, section in INT_FIELDS:
            out[section][name] = getattr(self, name)
        out["model_cfg"].update(norm_epsilon=self.norm_epsilon,
                                compress_factor=self.compress_factor)
        out["stft_cfg"]["sfi"] = self.sfi
        return out

    @classmethod
    def from_dict(cls, cfg: dict) -> ModelConfig:
        """Build from config.json ({"model_cfg": ..., "stft_cfg": ...}), rejecting absurd sizes."""
        if not isinstance(cfg, dict) or not isinstance(cfg.get("model_cfg"), dict):
            raise IncompatibleModelError("config.json has no 'model_cfg' object")
        model_cfg = cfg["model_cfg"]
        stft_cfg = cfg.get("stft_cfg") or {}
        if not isinstance(stft_cfg, dict):
            raise IncompatibleModelError("config.json 'stft_cfg' is not an object")
        defaults = cls()
        values = {}
        sections = {"model_cfg": model_cfg, "stft_cfg": stft_cfg}
        for name, section in INT_FIELDS:
            raw = sections[section].get(name, getattr(defaults, name))
            if isinstance(raw, bool) or not isinstance(raw, int):
                raise IncompatibleModelError(f"config.json {name} must be an integer, got {raw!r}")
            values[name] = raw
        epsilon = model_cfg.get("norm_epsilon", defaults.norm_epsilon)
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) \
                or not 0 < epsilon <= 1:  # also rejects NaN and the 1e999 that JSON reads as inf
            raise IncompatibleModelError(
                f"config.json norm_epsilon must be a number in (0, 1], got {epsilon!r}"
            )
        values["norm_epsilon"] = float(epsilon)
        values["compress_factor"] = model_cfg.get("compress_factor", defaults.compress_factor)
        sfi = stft_cfg.get("sfi", defaults.sfi)
        if not isinstance(sfi, bool):  # "false" as a string would read as true
            raise IncompatibleModelError(f"config.json sfi must be true or false, got {sfi!r}")
        values["sfi"] = sfi
        config = cls(**values)
        config.check()
        return config

    def check(self) -> None:
        """Reject configurations this implementation cannot run, before anything is allocated."""
        limits = {
            "num_tfmamba": (1, 64), "hid_feature": (1, 512), "expand": (1, 16),
            # the official model: n_fft 320 at 8 kHz; memory per frame grows with n_fft
            "n_fft": (16, MAX_BASE_N_FFT), "hop_size": (1, MAX_BASE_N_FFT),
            "win_size": (16, MAX_BASE_N_FFT),
            "sampling_rate": (1000, MAX_SAMPLE_RATE),
        }
        for name, (low, high) in limits.items():
            value = getattr(self, name)
            if not low <= value <= high:
                raise IncompatibleModelError(
                    f"config.json {name}={value} is outside the supported range {low}..{high}"
                )
        # the kernels' state size and conv width are compiled in (kernels/build.py)
        fixed = {"d_state": D_STATE, "d_conv": CONV_WIDTH, "input_channel": 2,
                 "output_channel": 1}
        for name, required in fixed.items():
            if getattr(self, name) != required:
                raise IncompatibleModelError(
                    f"config.json {name}={getattr(self, name)}: speechlens requires {required}"
                )
        if self.compress_factor != "relu_log1p":
            raise IncompatibleModelError(
                f"config.json compress_factor={self.compress_factor!r}: "
                "only 'relu_log1p' is supported"
            )
        if self.win_size != self.n_fft:
            raise IncompatibleModelError("config.json win_size must equal n_fft")
        # Overlap-add divides by the summed squared window: with hop > n_fft/2 it nears zero
        # between frames (gaps, noise blown up); a tiny hop multiplies frames, time and memory.
        if not self.n_fft <= MAX_HOP_DIVISOR * self.hop_size <= MAX_HOP_DIVISOR * self.n_fft // 2:
            raise IncompatibleModelError(
                f"config.json hop_size={self.hop_size} must be between n_fft/{MAX_HOP_DIVISOR} "
                f"and n_fft/2 (n_fft={self.n_fft}; the official model uses n_fft/8)"
            )

    def stft_params(self, sample_rate: int) -> StftParams:
        """The per-rate STFT rule: scale the base sizes, floor, then round odd values up."""
        if not self.sfi:
            if sample_rate != self.sampling_rate:
                raise IncompatibleModelError(
                    f"this model runs only at {self.sampling_rate} Hz (sfi is false)"
                )
            return StftParams(self.n_fft, self.hop_size, self.win_size)
        scale = lambda base: _make_even(base * sample_rate // self.sampling_rate)  # noqa: E731
        return StftParams(scale(self.n_fft), scale(self.hop_size), scale(self.win_size))
