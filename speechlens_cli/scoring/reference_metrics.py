"""Scores against a clean recording of the same speech, both at 16 kHz mono: PESQ wide-band
(ITU-T P.862.2, the `pesq` package), STOI (`pystoi`) and SI-SDR (Le Roux et al., 2019)."""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import AudioInputError
from . import extra
from .speech import RATE, Speech

#: Most the two lengths may differ, in seconds, and still be the same recording (a codec's
#: padding, a resampler's rounding); the longer is cut to the shorter.
LENGTH_TOLERANCE = 0.1


@dataclass(frozen=True)
class ReferenceScores:
    pesq_wb: float
    #: None where too little speech is left for STOI (30 frames of 25.6 ms after silence is cut).
    stoi: float | None
    si_sdr_db: float

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)


def si_sdr_db(reference: np.ndarray, estimate: np.ndarray) -> float:
    """Scale-invariant signal-to-distortion ratio in dB, both made zero-mean first. The epsilon
    keeps an exact (scaled) copy finite: it scores about 10*log10(energy / eps), far above any
    real enhancement."""
    reference = reference.astype(np.float64) - reference.mean(dtype=np.float64)
    estimate = estimate.astype(np.float64) - estimate.mean(dtype=np.float64)
    eps = np.finfo(np.float64).eps
    target = reference * (np.dot(estimate, reference) + eps) / (np.dot(reference, reference) + eps)
    distortion = estimate - target
    return float(10 * np.log10((np.dot(target, target) + eps) / (np.dot(distortion, distortion)
                                                                 + eps)))


def pesq_wb(reference: np.ndarray, degraded: np.ndarray, name: str) -> float:
    pesq = extra.load("pesq")
    try:
        with np.errstate(divide="ignore", invalid="ignore"):  # it divides by the peak: 0 if silent
            return float(pesq.pesq(RATE, reference, degraded, "wb"))
    except pesq.PesqError as error:   # no speech found, or under a quarter of a second
        raise AudioInputError(f"{name}: PESQ cannot compare it with the reference "
                              f"({_pesq_reason(error)})") from None


def _pesq_reason(error: Exception) -> str:
    """Its message, which the package gives as bytes."""
    reason = error.args[0] if error.args else ""
    if isinstance(reason, bytes):
        reason = reason.decode(errors="replace")
    return str(reason).strip().rstrip(".").lower() or type(error).__name__


def stoi(reference: np.ndarray, degraded: np.ndarray) -> float | None:
    pystoi = extra.load("pystoi")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = float(pystoi.stoi(reference, degraded, RATE))
    if any("Not enough STFT frames" in str(warning.message) for warning in caught):
        return None   # pystoi's stand-in then is 1e-5, which reads as a score
    return value if np.isfinite(value) else None


def compare(reference: Speech, degraded: Speech) -> ReferenceScores:
    """All three scores of `degraded` against `reference`, over their common length."""
    gap = abs(reference.seconds - degraded.seconds)
    if gap > LENGTH_TOLERANCE:
        raise AudioInputError(f"{degraded.name}: is {degraded.seconds:.2f} s long and the "
                              f"reference {reference.name} {reference.seconds:.2f} s: not "
                              "recordings of the same speech")
    length = min(len(reference.samples), len(degraded.samples))
    clean = reference.samples[:length].astype(np.float64)
    scored = degraded.samples[:length].astype(np.float64)
    return ReferenceScores(pesq_wb(clean, scored, degraded.name), stoi(clean, scored),
                           si_sdr_db(clean, scored))
