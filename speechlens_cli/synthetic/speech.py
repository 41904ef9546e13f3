"""Deterministic synthetic "speech-like" audio, with coloured noise at a chosen SNR.

`speech_like` builds voiced syllables: a harmonic source with a gliding pitch (100-250 Hz)
shaped by three moving formant resonances, an attack/decay envelope at syllable rate,
occasional fricative noise bursts at onsets, and short pauses. The syllable plan depends only
on the seed and the duration, not on the sample rate, so the same seed gives the "same
utterance" at every rate.
"""

from __future__ import annotations

import numpy as np

# (F1, F2, F3) in Hz for a few vowels (Peterson & Barney averages, adult male).
_VOWELS = (
    (730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480),
    (570, 840, 2410), (660, 1720, 2410), (440, 1020, 2240), (490, 1350, 1690),
)
_FORMANT_BW = np.array([90.0, 110.0, 160.0])
_FORMANT_GAIN = np.array([1.0, 0.5, 0.25])
_PITCH_RANGE = (100.0, 250.0)
SPEECH_PEAK = 0.5
MIX_PEAK_LIMIT = 0.9


def _num_samples(sample_rate: int, seconds: float) -> int:
    if sample_rate <= 0 or seconds < 0:
        raise ValueError(f"need sample_rate > 0 and seconds >= 0, got {sample_rate}, {seconds}")
    return round(sample_rate * seconds)


def _syllable_plan(rng: np.random.Generator, seconds: float) -> list[dict]:
    """Syllable timings and parameters, in seconds and Hz (independent of the sample rate)."""
    plan = []
    pos = rng.uniform(0.02, 0.06)
    vowel = int(rng.integers(len(_VOWELS)))
    while pos < seconds:
        dur = rng.uniform(0.12, 0.28)
        next_vowel = int(rng.integers(len(_VOWELS)))
        plan.append({
            "start": pos,
            "dur": dur,
            "f0": (rng.uniform(*_PITCH_RANGE), rng.uniform(*_PITCH_RANGE)),
            "vibrato": (rng.uniform(3.0, 6.0), rng.uniform(0.0, 6.0), rng.uniform(0, 2 * np.pi)),
            "formants": (_VOWELS[vowel], _VOWELS[next_vowel]),
            "gain": rng.uniform(0.6, 1.0),
            "phase": rng.uniform(0, 2 * np.pi),
            "burst": rng.uniform(0.015, 0.04) if rng.random() < 0.4 else 0.0,
        })
        vowel = next_vowel
        pause = rng.uniform(0.08, 0.22) if rng.random() < 0.3 else rng.uniform(0.0, 0.03)
        pos += dur + pause
    return plan


def _render_syllable(s: dict, sample_rate: int, n: int, noise: np.random.Generator):
    """(first sample index, samples) of one syllable, or None if it falls outside [0, n)."""
    i0 = round(s["start"] * sample_rate)
    i1 = min(n, round((s["start"] + s["dur"]) * sample_rate))
    if i1 - i0 < 8:
        return None
    tau = np.arange(i1 - i0) / sample_rate
    frac = tau / s["dur"]
    rate, depth, vib_phase = s["vibrato"]
    f0 = s["f0"][0] + (s["f0"][1] - s["f0"][0]) * frac
    f0 = f0 + depth * np.sin(2 * np.pi * rate * tau + vib_phase)
    f0 = np.clip(f0, *_PITCH_RANGE)
    phase = s["phase"] + 2 * np.pi * np.cumsum(f0) / sample_rate

    limit = min(0.45 * sample_rate, 5000.0)
    k = np.arange(1, int(limit // _PITCH_RANGE[0]) + 1)[:, None]          # harmonics [K, 1]
    freq = k * f0[None, :]                                                   # [K, L]
    fa, fb = (np.asarray(f, dtype=np.float64) for f in s["formants"])
    formants = fa[:, None] + (fb - fa)[:, None] * frac[None, :]              # [3, L]
    amp = np.full(freq.shape, 0.02)
    for i in range(3):
        amp += _FORMANT_GAIN[i] / (1.0 + ((freq - formants[i]) / (_FORMANT_BW[i] / 2)) ** 2)
    amp *= (freq < limit) / (1.0 + freq / 2000.0)                            # spectral tilt
    voiced = (amp * np.sin(k * phase[None, :])).sum(axis=0)

    attack = 1.0 - np.exp(-tau / 0.015)
    decay = 1.0 - np.exp(-(s["dur"] - tau) / 0.03)
    out = s["gain"] * voiced * attack * np.clip(decay, 0.0, 1.0)
    if s["burst"] > 0:                                       # fricative onset: high-passed noise
        m = min(len(out), int(s["burst"] * sample_rate))
        if m > 1:
            out[:m] += 0.15 * np.diff(noise.standard_normal(m + 1)) * np.hanning(m)
    return i0, out


def speech_like(sample_rate: int, seconds: float, seed: int = 0) -> np.ndarray:
    """Deterministic speech-like float32 mono signal [N], N = round(sample_rate * seconds).

    Peak is SPEECH_PEAK (0.5) unless the signal is empty or silent.
    """
    n = _num_samples(sample_rate, seconds)
    plan = _syllable_plan(np.random.default_rng([seed, 0]), n / sample_rate)
    noise = np.random.default_rng([seed, 1])
    out = np.zeros(n, np.float64)
    for syllable in plan:
        rendered = _render_syllable(syllable, sample_rate, n, noise)
        if rendered is not None:
            i0, samples = rendered
            out[i0:i0 + len(samples)] += samples
    peak = np.abs(out).max() if n else 0.0
    if peak > 0:
        out *= SPEECH_PEAK / peak
    return out.astype(np.float32)


def coloured_noise(n: int, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-RMS noise: pink (1/f) with a random tilt, plus a little low-frequency rumble and hum."""
    if n == 0:
        return np.zeros(0)
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1.0 / sample_rate)
    tilt = rng.uniform(0.7, 1.3)                             # exponent of 1/f^(tilt/2) amplitude
    shape = 1.0 / np.maximum(f, 40.0) ** (tilt / 2)
    shape *= np.where(f < 150.0, 2.0, 1.0)                    # low-frequency rumble shelf
    shape[0] = 0.0                                            # no DC offset
    noise = np.fft.irfft(spec * shape, n)
    hum_f = 50.0 if rng.random() < 0.5 else 60.0
    t = np.arange(n) / sample_rate
    noise /= np.sqrt(np.mean(noise ** 2)) + 1e-30
    noise += 0.2 * np.sin(2 * np.pi * hum_f * t + rng.uniform(0, 2 * np.pi))
    return noise / (np.sqrt(np.mean(noise ** 2)) + 1e-30)


def noisy_speech(
    sample_rate: int,
    seconds: float,
    channels: int = 1,
    snr_db: float = 5.0,
    seed: int = 0,
) -> np.ndarray:
    """Speech plus coloured noise at `snr_db`, float32 [N] (channels == 1) or [N, C].

    Every channel carries the same speech (slightly different gain) and its own noise.
    The mixture is scaled down, keeping the SNR, if its peak would exceed MIX_PEAK_LIMIT.
    """
    if channels < 1:
        raise ValueError(f"channels must be >= 1, got {channels}")
    speech = speech_like(sample_rate, seconds, seed).astype(np.float64)
    n = len(speech)
    speech_power = np.mean(speech ** 2) if n else 0.0
    noise_rms = np.sqrt(speech_power / 10 ** (snr_db / 10)) if speech_power > 0 else 0.01
    mix = np.empty((n, channels), np.float64)
    for c in range(channels):
        noise = coloured_noise(n, sample_rate, np.random.default_rng([seed, 2, c]))
        mix[:, c] = speech * (1.0 - 0.1 * c / channels) + noise_rms * noise
    peak = np.abs(mix).max() if n else 0.0
    if peak > MIX_PEAK_LIMIT:
        mix *= MIX_PEAK_LIMIT / peak
    mix = mix.astype(np.float32)
    return mix[:, 0] if channels == 1 else mix
