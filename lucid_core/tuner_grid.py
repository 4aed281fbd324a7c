"""The System Tuner's grid: the values each swept knob takes, built around the current configuration.

A knob swept "around" its current value takes a smaller, the current and a larger value (every choice
for a text knob), always distinct: a current value of 0 steps up from 0, a tiny one is not rounded
into its neighbours, and bounds clip without collapsing the list to one repeated value. Values given
explicitly (the form's lists, the CLI's flags) are used as given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, get_type_hints

from lucid_core.config import ConfigError, LucidConfig

#: Form field -> config knob it sets (what the Params form and the CLI accept).
GRID_KNOBS: dict[str, str] = {
    "tprof_s": "profiler.tprof_s",
    "nprof_gpus": "profiler.nprof_gpus",
    "cprof_nodes": "profiler.pool_nodes",
    "tiny_threshold": "binder.tiny_threshold",
    "medium_threshold": "binder.medium_threshold",
    "sharing": "binder.sharing",
    "update_cadence": "update.cadence",
    "pair_priority_ratio": "binder.pair_priority_ratio",
    "aging": "orchestrator.aging",
    "guard_slowdown": "orchestrator.guard_slowdown",
    "backfill_margin": "orchestrator.backfill_margin",
    "long_quantile": "orchestrator.long_quantile",
    "guard_tail": "orchestrator.guard_tail",
    "yield_margin": "orchestrator.yield_margin",
    "yield_max": "orchestrator.yield_max",
}

#: Knobs swept around their current value when nothing else is asked for.
DEFAULT_AROUND: tuple[str, ...] = ("tprof_s", "sharing")
#: A number knob's neighbours are its value divided and multiplied by this.
FACTOR = 2.0
#: A knob bounded to [0, 1] (thresholds, quantiles) moves by this much instead.
FRACTION_STEP = 0.05
#: Significant digits a generated value keeps (the current value is never rounded).
DIGITS = 3
#: The first step up from a current value of 0, for knobs whose useful scale is not 1.
ZERO_STEPS: dict[str, float] = {"orchestrator.aging": 16.0, "profiler.tprof_s": 100.0}


@dataclass(frozen=True)
class KnobRange:
    """What values a knob takes: its type, bounds and choices, read from the config's own metadata."""

    knob: str
    kind: type
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] | None = None

    @property
    def is_fraction(self) -> bool:
        """A number bounded to [0, 1]: stepped by adding `FRACTION_STEP`, not by multiplying."""
        return self.kind is float and self.lo == 0 and self.hi == 1

    def clip(self, value: float) -> float:
        """`value` inside the knob's bounds."""
        if self.lo is not None:
            value = max(self.lo, value)
        if self.hi is not None:
            value = min(self.hi, value)
        return value


def knob_name(key: str) -> str:
    """The dotted knob of a form name (`tprof_s`) or of a dotted key; an error for anything else."""
    knob = GRID_KNOBS.get(key, key)
    if "." not in knob:
        raise ConfigError(f"unknown tuner knob {key!r}; known: {', '.join(GRID_KNOBS)}")
    return knob


@cache
def knob_range(knob: str) -> KnobRange:
    """The type, bounds and choices of a dotted knob (`profiler.tprof_s`)."""
    section_name, _, name = knob.partition(".")
    sections = get_type_hints(LucidConfig)
    if section_name not in sections:
        raise ConfigError(f"unknown config section in {knob!r}")
    section = sections[section_name]
    meta = {f.name: f.metadata for f in fields(section)}
    if name not in meta:
        raise ConfigError(f"unknown knob {knob!r}")
    kind = get_type_hints(section)[name]
    return KnobRange(knob, kind, meta[name].get("lo"), meta[name].get("hi"), meta[name].get("choices"))


def knob_value(config: LucidConfig, knob: str) -> Any:
    """The value of a dotted knob (`profiler.tprof_s`) in `config`."""
    section, _, name = knob.partition(".")
    return getattr(getattr(config, section), name)


def knob_text(value: Any) -> str:
    """A knob's value as a person writes it (200, not 200.0)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _rounded(value: float) -> float:
    """`value` to `DIGITS` significant digits (0 stays 0)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, DIGITS - 1 - math.floor(math.log10(abs(value))))


def _number_candidates(current: float, knob: KnobRange) -> list[float]:
    """Neighbours of a number knob's value, before clipping: below, the value, above, and further out."""
    if knob.is_fraction:
        return [current - FRACTION_STEP, current, current + FRACTION_STEP,
                current - 2 * FRACTION_STEP, current + 2 * FRACTION_STEP]
    if current == 0:
        step = ZERO_STEPS.get(knob.knob, 1.0)
        return [0.0, step, FACTOR * step, FACTOR * FACTOR * step]
    if knob.kind is int:
        return [math.floor(current / FACTOR), current, max(current * FACTOR, current + 1),
                max(current * FACTOR * FACTOR, current + 2)]
    return [current / FACTOR, current, current * FACTOR, current / FACTOR / FACTOR, current * FACTOR * FACTOR]


def values_around(current: Any, knob: KnobRange, width: int = 3) -> list[Any]:
    """Up to `width` distinct values of `knob` around `current`, `current` among them, in increasing order
    (a text knob: all its choices; a flag: both). At least two whenever the knob can take two."""
    if knob.choices:
        return list(knob.choices)
    if knob.kind is bool:
        return [False, True]
    kept: list[Any] = [current]
    seen = {knob_text(current)}
    for candidate in _number_candidates(float(current), knob):
        value = knob.clip(candidate if knob.kind is int else _rounded(candidate))
        value = round(value) if knob.kind is int else float(value)
        if knob_text(value) not in seen and len(kept) < width:
            seen.add(knob_text(value))
            kept.append(value)
    return sorted(kept)


def grid_around(base: LucidConfig, keys: Sequence[str], width: int = 3) -> dict[str, list[Any]]:
    """For each knob of `keys` (form names or dotted), the values around its value in `base`."""
    grid: dict[str, list[Any]] = {}
    for key in keys:
        knob = knob_name(key)
        grid[knob] = values_around(knob_value(base, knob), knob_range(knob), width)
    return grid


def grid_request(explicit: Mapping[str, Any], around: Sequence[str], base: LucidConfig) -> dict[str, list[Any]]:
    """The grid a sweep runs: a knob's explicit values when given, values around the current one when the
    knob is in `around` and has none; every other knob keeps its current value (no axis)."""
    grid: dict[str, list[Any]] = {}  # keyed as given (a form field's name stays one, for its error messages)
    for key, values in explicit.items():
        given = [] if values is None else list(values) if isinstance(values, list | tuple) else [values]
        if given:
            grid[key] = given
    named = {knob_name(key) for key in grid}
    missing = [key for key in around if knob_name(key) not in named]
    grid.update(grid_around(base, missing))
    return grid


def grid_size(grid: Mapping[str, Sequence[Any]]) -> int:
    """How many combinations `grid` expands to, before any is built or checked."""
    return math.prod(len(values) for values in grid.values())


def is_current(overrides: Mapping[str, Any], base: LucidConfig) -> bool:
    """Whether every knob `overrides` sets already has that value in `base`."""
    return all(knob_text(value) == knob_text(knob_value(base, knob)) for knob, value in overrides.items())


def drop_current(configs: Sequence[Mapping[str, Any]], base: LucidConfig) -> list[dict[str, Any]]:
    """The configurations that differ from `base` (the current one is always replayed on its own); all of
    them when every one equals it, so a sweep of only the current values still runs."""
    differing = [dict(c) for c in configs if not is_current(c, base)]
    return differing or [dict(c) for c in configs]
