"""Emulated telemetry for hosts without NVIDIA GPUs: each configuration's profile from a reference catalog.

Speeds are still measured for real (on whatever device the host has); only the NVML triple
(UG %, UM %, MG MB) is looked up, and every telemetry record then says emulated.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lucid_core.calibration.configs import WorkloadConfig

Triple = tuple[float, float, float]

# used when the reference catalog has no row for a configuration: rough, documented stand-ins
DEFAULT_TRIPLE: Triple = (40.0, 15.0, 2500.0)


@dataclass(frozen=True)
class EmulatedProfiles:
    """(model, batch size, amp) -> (gpu_util, mem_util, gpu_mem_mb), with a fallback triple."""

    table: Mapping[tuple[str, int, int], Triple] = field(default_factory=dict)
    fallback: Triple = DEFAULT_TRIPLE
    source: str = "defaults"
    # the GPU the catalog's environment.json names: "emulated" unless a caller declares the GPU it stands for
    gpu_model: str = "emulated"

    @classmethod
    def from_single_data(cls, path: str | Path) -> EmulatedProfiles:
        """Profiles from a single_data.csv (e.g. the artifact's RTX 3090 measurements)."""
        table = {}
        with Path(path).open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                table[(row["model"], int(row["batchsize"]), int(row["amp"]))] = (
                    float(row["gpu_util"]), float(row["gmem_util"]), float(row["gmem"]))
        return cls(table=table, source=str(path))

    def solo(self, config: WorkloadConfig) -> Triple:
        return self.table.get((config.model, config.batch_size, int(config.amp)), self.fallback)

    def pair(self, a: WorkloadConfig, b: WorkloadConfig) -> Triple:
        """Two jobs on one GPU: utilizations add up to at most 100 %, footprints add up."""
        (ua, ma, ga), (ub, mb, gb) = self.solo(a), self.solo(b)
        return (min(100.0, ua + ub), min(100.0, ma + mb), ga + gb)
