"""How long enhancing takes on this machine: seconds of work per million samples, measured by
each run and kept in the cache folder for the next one's estimate."""

from __future__ import annotations

import json
import platform

from ..kernels.sources import cache_dir, store_in_cache

RATES_FILE = "speeds.json"
#: A shorter file times mostly opening and writing, not the model: not kept as a rate.
MIN_MEASURED_S = 1.0


def rate_key(model, device: str, strict: bool) -> str:
    """What the speed depends on: this machine (by host name, as a cluster's shared home folder
    serves several), the device, the mode and the model's size."""
    size = "x".join(str(value) for value in model.config.size().values())
    return f"{platform.node()}/{device}/{'strict' if strict else 'standard'}/{size}"


def _stored() -> dict:
    try:
        rates = json.loads((cache_dir() / RATES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or unreadable: measured again
        return {}
    return rates if isinstance(rates, dict) else {}


def stored_rate(key: str) -> float | None:
    """Seconds per million samples measured here before, if any."""
    rate = _stored().get(key)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        return None
    return float(rate)


def store_rate(key: str, elapsed: float, samples: int) -> None:
    """Keep the rate of a file that took long enough to time the model."""
    if elapsed < MIN_MEASURED_S or samples <= 0:
        return
    rates = _stored()
    rates[key] = round(elapsed / samples * 1e6, 4)
    store_in_cache(cache_dir() / RATES_FILE, (json.dumps(rates, indent=1) + "\n").encode())


def about(seconds: float) -> str:
    """A duration as a person says it: "about 40 s", "about 11 min", "about 2.5 h"."""
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    if seconds < 90 * 60:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"
