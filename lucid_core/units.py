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


#: seconds per unit of a duration a person types
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds from a duration a person types: `90m`, `1.5h`, `2d`, `45s`, or Slurm's `--time` forms read as
    Slurm reads them: `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`.

    A bare number is refused: Slurm reads it as minutes and most other tools as seconds, so it would mean
    something different to half the people who type it."""
    import re

    cleaned = text.strip().lower()
    unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|min|h|d)", cleaned, re.ASCII)
    if unit:
        return float(unit.group(1)) * _DURATION_UNITS[unit.group(2)]
    days, dash, clock = cleaned.rpartition("-")
    parts = clock.split(":")
    if (not dash or (days.isascii() and days.isdigit())) and len(parts) <= 3 and all(
            p.isascii() and p.isdigit() for p in parts):
        numbers = [int(p) for p in parts]
        if days:  # D-HH, D-HH:MM, D-HH:MM:SS
            hours, minutes, seconds = [*numbers, 0, 0][:3]
        elif len(numbers) == 3:  # HH:MM:SS
            hours, minutes, seconds = numbers
        elif len(numbers) == 2:  # MM:SS, any number of minutes
            hours, minutes, seconds = 0, numbers[0], numbers[1]
        else:
            hours = minutes = seconds = 60  # a bare number: refused below
        if seconds < 60 and (minutes < 60 or (not days and len(numbers) == 2)) and (not days or hours < 24):
            return float(((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds)
    raise ValueError(f"{text!r} is not a duration: give a number with a unit (45s, 90m, 1.5h, 2d) or Slurm's "
                     "form (MM:SS, HH:MM:SS, D-HH:MM:SS)")


def one_line(text: object, limit: int = 80) -> str:
    """Text a host or a job wrote (an error), as one short line in a message: whitespace runs made one space,
    cut at `limit` characters; "" for anything that is not text."""
    return " ".join(text.split())[:limit] if isinstance(text, str) else ""
