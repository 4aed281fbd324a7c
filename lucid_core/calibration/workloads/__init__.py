"""The calibration workloads: small PyTorch training loops on generated data (no downloads).

This module is torch-free: it only names the workloads. Each workload module exposes
``build(batch_size, device, amp) -> step`` where ``step()`` runs one training iteration.
Run one with ``python -m lucid_core.calibration.workloads run --workload resnet18 ...``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkloadInfo:
    """A workload's name, the (model, dataset) it stands for in the catalog, and its sizes."""

    name: str
    model: str
    dataset: str
    module: str
    batch_sizes: tuple[int, ...]
    amp: bool = True  # whether an AMP variant is meaningful
    unit: str = "iteration"

    def builder(self) -> Callable[..., Any]:
        """The workload's ``build`` function (imports torch)."""
        return importlib.import_module(f"{__name__}.{self.module}").build


WORKLOADS: dict[str, WorkloadInfo] = {
    w.name: w
    for w in (
        WorkloadInfo("resnet18", "ResNet18", "CIFAR-10", "resnet", (32, 64, 128)),
        WorkloadInfo("transformer", "TransformerLM", "WikiText-2", "transformer", (16, 32, 64)),
        WorkloadInfo("lstm", "LSTM", "Wikitext2", "lstm", (64, 128)),
        WorkloadInfo("neumf", "NeuMF", "MovieLens", "neumf", (64, 128)),
        WorkloadInfo("dcgan", "DCGAN", "LSUN", "dcgan", (32, 64, 128)),
        WorkloadInfo("pointnet", "PointNet", "ShapeNet", "pointnet", (32, 64, 128)),
        WorkloadInfo("ppo", "PPO", "LunarLander", "ppo", (32, 64, 128), amp=False, unit="env step"),
    )
}


def get_workload(name: str) -> WorkloadInfo:
    """The named workload; ValueError listing the known names otherwise."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}") from None
