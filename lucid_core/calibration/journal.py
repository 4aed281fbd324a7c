"""The calibration journal: every solo and pair measurement as one JSON line, the source of truth.

The catalog CSVs are derived from it after every trial, and a rerun reads it to skip what is
already measured (that is what makes calibration resumable).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lucid_core.calibration.configs import WorkloadConfig
from lucid_core.domain import MAX_PAIR_SPEED, MIN_PAIR_SPEED

JOURNAL_NAME = "measurements.jsonl"


def pair_key(a: WorkloadConfig, b: WorkloadConfig) -> tuple[str, str]:
    """Order-free identity of a pair."""
    return (a.key, b.key) if a.key <= b.key else (b.key, a.key)


@dataclass(frozen=True)
class SoloRecord:
    """A configuration measured alone on one GPU: its speed and its NVML profile (UG, UM, MG)."""

    config: WorkloadConfig
    iters_per_s: float
    samples_per_s: float
    gpu_util: float
    mem_util: float
    gpu_mem_mb: float
    telemetry_samples: int
    emulated: bool
    run_id: str
    host: str
    gpu: int
    device: str = ""
    gpu_name: str = ""
    torch_version: str = ""
    measured_at: float = 0.0


@dataclass(frozen=True)
class PairRecord:
    """Two configurations sharing one GPU: each one's speed normalized by its solo speed."""

    first: WorkloadConfig
    second: WorkloadConfig
    speed_first: float
    speed_second: float
    iters_per_s_first: float
    iters_per_s_second: float
    gpu_util: float
    mem_util: float
    gpu_mem_mb: float
    overlap: float  # share of the measured windows during which both ran
    telemetry_samples: int
    emulated: bool
    run_id: str
    host: str
    gpu: int
    measured_at: float = 0.0


@dataclass(frozen=True)
class RefusedPair:
    """A pair not measured because it cannot share the GPU (summed memory would not fit)."""

    first: WorkloadConfig
    second: WorkloadConfig
    reason: str


@dataclass(frozen=True)
class FailedTrial:
    """A solo or pair run that did not produce a measurement; it is retried with the next attempt."""

    configs: tuple[WorkloadConfig, ...]
    run_id: str
    attempt: int
    error: str


Record = SoloRecord | PairRecord | RefusedPair | FailedTrial



def _finite(value: object, low: float = -math.inf, high: float = math.inf) -> bool:
    """A finite int or float (not a bool) in [low, high]."""
    return (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            and low <= value <= high)


def _profile_problem(gpu_util: object, mem_util: object, gpu_mem_mb: object) -> str | None:
    """What is wrong with an NVML profile (utilizations are percentages, memory is not negative), or None."""
    if not (_finite(gpu_util, 0.0, 100.0) and _finite(mem_util, 0.0, 100.0) and _finite(gpu_mem_mb, 0.0)):
        return f"profile UG {gpu_util!r} %, UM {mem_util!r} %, MG {gpu_mem_mb!r} MB is out of range"
    return None


def record_problem(record: Record) -> str | None:
    """Why a measurement cannot be believed (None: it can). Speeds must be finite and positive, a pair's
    normalized speeds in [MIN_PAIR_SPEED, MAX_PAIR_SPEED] (the range the catalog readers take): a NaN, negative or
    huge speed would otherwise reach the
    catalog, where one huge speed lifts a configuration's mean to Tiny and an unsafe pair looks safe."""
    if isinstance(record, SoloRecord):
        if not (_finite(record.iters_per_s) and record.iters_per_s > 0
                and _finite(record.samples_per_s) and record.samples_per_s > 0):
            return (f"{record.config.key} alone ran at {record.iters_per_s!r} iterations/s "
                    f"({record.samples_per_s!r} samples/s): not a positive speed")
        return _profile_problem(record.gpu_util, record.mem_util, record.gpu_mem_mb)
    if isinstance(record, PairRecord):
        for config, speed in ((record.first, record.speed_first), (record.second, record.speed_second)):
            if not (_finite(speed, MIN_PAIR_SPEED, MAX_PAIR_SPEED)):
                return (f"{config.key} beside its partner ran at {speed!r} of its speed alone (a pair's normalized "
                        f"speed must be between {MIN_PAIR_SPEED} and {MAX_PAIR_SPEED}; one of the two runs is wrong)")
        return _profile_problem(record.gpu_util, record.mem_util, record.gpu_mem_mb)
    return None


_KINDS: dict[str, type] = {"solo": SoloRecord, "pair": PairRecord, "refused": RefusedPair, "failed": FailedTrial}
_CONFIG_FIELDS = {"config", "first", "second"}


def _encode(record: Record) -> str:
    kind = next(k for k, cls in _KINDS.items() if isinstance(record, cls))
    return json.dumps({"kind": kind, **asdict(record)}, sort_keys=True)


def _config(data: dict[str, Any]) -> WorkloadConfig:
    return WorkloadConfig(data["workload"], int(data["batch_size"]), bool(data["amp"]))


def _decode(line: str) -> Record:
    data = json.loads(line)
    cls = _KINDS[data.pop("kind")]
    for name in _CONFIG_FIELDS & data.keys():
        data[name] = _config(data[name])
    if "configs" in data:
        data["configs"] = tuple(_config(c) for c in data["configs"])
    return cls(**data)


@dataclass
class Journal:
    """Measurements so far, indexed for the harness; `append` writes through to the file."""

    path: Path
    solos: dict[str, SoloRecord] = field(default_factory=dict)
    pairs: dict[tuple[str, str], PairRecord] = field(default_factory=dict)
    refused: dict[tuple[str, str], RefusedPair] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)  # trial id -> failed attempts
    rejected: list[str] = field(default_factory=list)  # lines holding a measurement not believed, and why

    @classmethod
    def open(cls, directory: str | Path) -> Journal:
        """Load the journal in `directory` (empty when new); a torn last line is ignored, and a measurement
        `record_problem` refuses is noted in `rejected` and left out (its trial is measured again)."""
        journal = cls(Path(directory) / JOURNAL_NAME)
        if journal.path.exists():
            text = journal.path.read_text(encoding="utf-8")
            if text and not text.endswith("\n"):  # end a torn line so the next record starts on its own
                with journal.path.open("a", encoding="utf-8") as handle:
                    handle.write("\n")
            for number, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    record = _decode(line)
                except (json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError):
                    continue
                problem = record_problem(record)
                if problem is not None:
                    journal.rejected.append(f"{journal.path} line {number}: {problem}")
                    continue
                journal._index(record)
        return journal

    def _index(self, record: Record) -> None:
        if isinstance(record, SoloRecord):
            self.solos[record.config.key] = record
        elif isinstance(record, PairRecord):
            self.pairs[pair_key(record.first, record.second)] = record
        elif isinstance(record, RefusedPair):
            self.refused[pair_key(record.first, record.second)] = record
        else:
            trial = trial_id(record.configs)
            self.failures[trial] = max(self.failures.get(trial, 0), record.attempt)

    def append(self, record: Record) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(_encode(record) + "\n")
        self._index(record)

    def has_pair(self, a: WorkloadConfig, b: WorkloadConfig) -> bool:
        return pair_key(a, b) in self.pairs


def trial_id(configs: tuple[WorkloadConfig, ...]) -> str:
    """'solo-<key>' or 'pair-<key>-<key>' (sorted), used in run ids and failure counts."""
    if len(configs) == 1:
        return f"solo-{configs[0].key}"
    a, b = pair_key(*configs)
    return f"pair-{a}-{b}"
