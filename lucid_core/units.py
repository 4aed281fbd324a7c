"""How quantities read to a person: a duration and a GPU-time, each in the unit its size reads best in.

The policy's decision reasons, the pending words and the CLI print them the same way, so a 10-minute
one-GPU job reads "10 GPU-min" everywhere rather than "0.00 GPU-h" in some places.
"""

from __future__ import annotations


def duration_words(seconds: float) -> str:
    """A duration rounded for a person: 42 s, 12.5 min, 10.8 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def gpu_time_words(gpu_s: float) -> str:
    """GPU-time in the unit its size reads best in: 42 GPU-s, 1.5 GPU-min, 12 GPU-min, 3.4 GPU-h, 120 GPU-h."""
    # a unit from just under its size on, where the smaller one would round to 60 of it
    unit, size = next(((u, s) for u, s in (("GPU-h", 3600.0), ("GPU-min", 60.0)) if gpu_s >= s - s / 120),
                      ("GPU-s", 1.0))
    value = gpu_s / size
    return f"{value:.1f} {unit}" if value < 9.95 and unit != "GPU-s" else f"{value:.0f} {unit}"
