"""DNSMOS P.835 (SIG, BAK, OVRL) and P.808 MOS, computed as Microsoft's dnsmos_local.py
(DNS-Challenge) computes them, on the ONNX models the MIT-licensed `speechmos` wheel ships.

A clip is cut into 9.01-s segments at 1-s hops (a clip shorter than one is repeated until it is
not); each segment goes whole to the P.835 model, whose three outputs are mapped through the
non-personalized polynomial fits (dnsmos_local.py's default), and, less its last 160 samples, as a
log-mel spectrogram to the P.808 model; each score is the mean over the segments. The level is
never normalised. The log-mel is librosa's melspectrogram (n_fft 321, hop 160, 120 Slaney mels,
a periodic Hann window, centred frames padded with zeros, power 2) through
power_to_db(ref=max, top_db=80), then (x + 40) / 40, computed here in NumPy.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import asdict, dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..errors import MissingExtraError
from . import extra
from .speech import RATE

SEGMENT_SECONDS = 9.01
N_FFT = 321
HOP = 160
N_MELS = 120
TOP_DB = 80.0
AMIN = 1e-10
#: dnsmos_local.py's polynomial fits (highest power first) of the non-personalized model.
POLYFITS = {"sig": (-0.08397278, 1.22083953, 0.0052439),
            "bak": (-0.13166888, 1.60915514, -0.39604546),
            "ovrl": (-0.06766283, 1.11546468, 0.04602535)}
#: The models inside the speechmos package, with the sha256 of Microsoft's published files: any
#: other model would give other numbers under the same names.
MODELS = {"p835": ("dnsmos_models/sig_bak_ovr.onnx",
                   "269fbebdb513aa23cddfbb593542ecc540284a91849ac50516870e1ac78f6edd"),
          "p808": ("dnsmos_models/model_v8.onnx",
                   "9246480c58567bc6affd4200938e77eef49468c8bc7ed3776d109c07456f6e91")}
#: Segments run through the models at once (bounded memory for a long file).
_BATCH = 8


@dataclass(frozen=True)
class DnsmosScores:
    sig: float
    bak: float
    ovrl: float
    p808: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def segments(samples: np.ndarray) -> list[np.ndarray]:
    """The 9.01-s segments dnsmos_local.py scores, with its floating-point arithmetic: a short
    clip doubled until it holds one, a segment every second, and one whose end that arithmetic
    puts a sample early left out, as it leaves it out (in a long file, those starting at 7 to
    16 s, among others)."""
    length = int(SEGMENT_SECONDS * RATE)
    while len(samples) < length:
        samples = np.concatenate([samples, samples])
    hops = int(np.floor(len(samples) / RATE) - SEGMENT_SECONDS) + 1
    cut = (samples[int(index * RATE):int((index + SEGMENT_SECONDS) * RATE)]
           for index in range(hops))
    return [segment for segment in cut if len(segment) >= length]


@functools.cache
def _window() -> np.ndarray:
    """Periodic Hann of N_FFT points (scipy's get_window('hann', N_FFT, fftbins=True))."""
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz (200/3 Hz a mel), logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / (200.0 / 3)
    logarithmic = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, logarithmic, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    linear = mel * (200.0 / 3)
    logarithmic = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, logarithmic, linear)


@functools.cache
def mel_filterbank() -> np.ndarray:
    """[N_MELS, N_FFT // 2 + 1] triangles between mel-spaced edges from 0 Hz to Nyquist, each
    scaled to unit area (Slaney's norm), kept in float32 as librosa.filters.mel keeps them."""
    bins_hz = np.arange(N_FFT // 2 + 1) * (RATE / N_FFT)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(RATE / 2), N_MELS + 2))
    below, centre, above = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins_hz - below) / (centre - below)
    falling = (above - bins_hz) / (above - centre)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return (triangles * (2.0 / (above - below))).astype(np.float32)


def log_mel(segment: np.ndarray) -> np.ndarray:
    """The P.808 model's input for one segment: [frames, N_MELS] float32."""
    padded = np.pad(np.asarray(segment, dtype=np.float64), N_FFT // 2)
    frames = sliding_window_view(padded, N_FFT)[::HOP]
    power = np.abs(np.fft.rfft(frames * _window(), axis=1)) ** 2
    mel = power @ mel_filterbank().T.astype(np.float64)
    decibels = 10.0 * np.log10(np.maximum(AMIN, mel)) - 10.0 * np.log10(max(AMIN, mel.max()))
    decibels = np.maximum(decibels, decibels.max() - TOP_DB)
    return ((decibels + 40.0) / 40.0).astype(np.float32)


@functools.cache
def _sessions() -> dict:
    """Both models, each on one CPU thread: scoring runs beside the enhancement, not over it."""
    ort = extra.load("onnxruntime")
    package = extra.load("speechmos")
    from importlib import resources

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    sessions = {}
    for key, (inside, sha256) in MODELS.items():
        model = resources.files(package).joinpath(inside)
        if not model.is_file():
            raise MissingExtraError(f"speechmos: has no {inside} (reinstall it: {extra.INSTALL})")
        data = model.read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise MissingExtraError(f"speechmos: its {inside} is not Microsoft's DNSMOS model "
                                    f"(sha256 differs; reinstall it: {extra.INSTALL})")
        sessions[key] = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return sessions


def _run(session, batch: np.ndarray) -> np.ndarray:
    return session.run(None, {session.get_inputs()[0].name: batch})[0]


def score(samples: np.ndarray) -> DnsmosScores:
    """DNSMOS of 16-kHz mono samples (float32 [N], N >= 1)."""
    sessions = _sessions()
    raw, p808 = [], []
    cut = segments(samples)
    for start in range(0, len(cut), _BATCH):
        group = cut[start:start + _BATCH]
        raw.append(_run(sessions["p835"], np.stack(group).astype(np.float32)))
        mels = np.stack([log_mel(segment[:-HOP]) for segment in group])
        p808.append(_run(sessions["p808"], mels)[:, 0])
    raw_scores = np.concatenate(raw).astype(np.float64)
    mapped = {key: float(np.mean(np.polyval(POLYFITS[key], raw_scores[:, column])))
              for column, key in enumerate(("sig", "bak", "ovrl"))}
    return DnsmosScores(**mapped, p808=float(np.mean(np.concatenate(p808))))
