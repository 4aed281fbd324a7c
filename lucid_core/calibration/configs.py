"""Workload configurations (workload, batch size, AMP) as the harness and the catalog name them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lucid_core.calibration.workloads import WorkloadInfo, get_workload


@dataclass(frozen=True, order=True)
class WorkloadConfig:
    """One measured configuration; `key` names it in run ids and the journal."""

    workload: str
    batch_size: int
    amp: bool = False

    def __post_init__(self) -> None:
        info = get_workload(self.workload)
        if self.batch_size < 1:
            raise ValueError(f"batch size must be positive, got {self.batch_size}")
        if self.amp and not info.amp:
            raise ValueError(f"workload {self.workload!r} has no AMP variant")

    @property
    def info(self) -> WorkloadInfo:
        return get_workload(self.workload)

    @property
    def key(self) -> str:
        return f"{self.workload}-b{self.batch_size}-amp{int(self.amp)}"

    @property
    def model(self) -> str:
        return self.info.model

    @property
    def dataset(self) -> str:
        """The catalog's dataset column: the shape-alike public data set, marked as generated."""
        return f"{self.info.dataset}-synthetic"

    def workload_args(self) -> list[str]:
        args = ["--workload", self.workload, "--batch-size", str(self.batch_size)]
        return [*args, "--amp"] if self.amp else args


def parse_config(text: str) -> WorkloadConfig:
    """'resnet18:32' or 'resnet18:32:amp' (a bare name takes its smallest batch size, no AMP)."""
    parts = text.strip().split(":")
    if not parts[0] or len(parts) > 3:
        raise ValueError(f"workload spec {text!r} must look like NAME[:BATCH[:amp]]")
    info = get_workload(parts[0])
    batch = int(parts[1]) if len(parts) > 1 and parts[1] else min(info.batch_sizes)
    amp = len(parts) == 3 and parts[2].lower() in {"amp", "1", "true", "yes"}
    if len(parts) == 3 and not amp and parts[2].lower() not in {"", "0", "fp32", "no", "false"}:
        raise ValueError(f"workload spec {text!r}: third part must be 'amp' or 'fp32'")
    return WorkloadConfig(info.name, batch, amp)


def parse_configs(specs: Iterable[str]) -> list[WorkloadConfig]:
    """Specs separated by commas or given one by one, duplicates dropped, order kept."""
    out: list[WorkloadConfig] = []
    for spec in specs:
        for item in spec.split(","):
            if item.strip():
                config = parse_config(item)
                if config not in out:
                    out.append(config)
    return out


def all_pairs(configs: Sequence[WorkloadConfig]) -> list[tuple[WorkloadConfig, WorkloadConfig]]:
    """Every unordered pair, a configuration with itself included (two copies of one job share too)."""
    return [(a, b) for i, a in enumerate(configs) for b in configs[i:]]
