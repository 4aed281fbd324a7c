"""Synthetic job logs with the recurrence real clusters show: users return to the same projects,
each campaign being a few short debug runs, a parameter sweep, then long final runs.

For tests and the demo (no real user or job names are published for Philly).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

FAMILIES = ("resnet50", "bert-base", "gpt2-small", "vit-b16", "yolov5", "unet", "lstm-lm", "dcgan", "ppo-atari",
            "efficientnet-b0", "t5-small", "pointnet")


@dataclass(frozen=True)
class _Project:
    user: str
    vc: str
    name: str
    log_base_s: float  # log of a sweep run's typical duration
    gpus: int
    gpu_util: float
    mem_util: float
    gpu_mem_mb: float


def _projects(rng: np.random.Generator, n_users: int, n_vcs: int) -> list[_Project]:
    projects = []
    for u in range(n_users):
        user, vc = f"user{u:03d}", f"vc{u % n_vcs}"
        for _ in range(int(rng.integers(1, 4))):
            family = FAMILIES[int(rng.integers(len(FAMILIES)))]
            util = float(np.clip(rng.normal(60, 25), 3, 100))
            dataset = rng.choice(["cifar", "imagenet", "squad", "coco", "wiki"])
            projects.append(_Project(
                user=user, vc=vc, name=f"{user[-3:]}-{family}-{dataset}",
                log_base_s=float(rng.normal(8.3, 1.0)), gpus=int(rng.choice([1, 1, 1, 2, 4, 8])),
                gpu_util=util, mem_util=float(np.clip(util * rng.uniform(0.2, 0.8), 0, 100)),
                gpu_mem_mb=float(rng.uniform(1500, 20000))))
    return projects


def synthetic_job_log(n_jobs: int = 5000, n_users: int = 30, n_vcs: int = 4, days: float = 21.0, seed: int = 0,
                      start: str = "2024-01-01") -> pd.DataFrame:
    """A job log sorted by submission: job_id, submit_time (s), submit_at, duration (s), gpus, vc, user,
    name, kind (debug | sweep | final) and the project's profile (gpu_util, mem_util, gpu_mem_mb)."""
    rng = np.random.default_rng(seed)
    projects = _projects(rng, n_users, n_vcs)
    weights = rng.pareto(1.2, len(projects)) + 0.2  # a few busy projects, many quiet ones
    weights /= weights.sum()
    rows: list[tuple] = []
    horizon = days * 86400.0
    while len(rows) < n_jobs:
        p = projects[int(rng.choice(len(projects), p=weights))]
        day = float(rng.uniform(0, days))
        hour = float(np.clip(rng.normal(14, 4), 0, 23.9))  # daytime-heavy submissions
        t = (np.floor(day) + hour / 24.0) * 86400.0
        for k in range(int(rng.integers(1, 5))):  # debug runs: short, one GPU, minutes apart
            rows.append((t, float(np.exp(rng.normal(np.log(150), 0.8))), 1, p, f"{p.name}_debug{k}", "debug"))
            t += float(rng.exponential(600))
        lr, bs = rng.choice([1e-4, 3e-4, 1e-3, 3e-3], size=2, replace=False), rng.choice([32, 64, 128])
        for k in range(int(rng.integers(3, 16))):  # sweep: a burst of similar runs
            d = float(np.exp(p.log_base_s + rng.normal(0, 0.35)))
            rows.append((t + k * rng.exponential(60), d, p.gpus, p, f"{p.name}_lr{lr[k % 2]:g}_bs{bs}_s{k}", "sweep"))
        t += float(rng.exponential(86400 / 2))
        for k in range(int(rng.integers(1, 3))):  # long final runs on more GPUs
            d = float(np.exp(p.log_base_s + np.log(4.0) + rng.normal(0, 0.3)))
            rows.append((t + k * 300, d, min(8, p.gpus * 2), p, f"{p.name}_final_v{k + 1}", "final"))
    rows = sorted((r for r in rows if r[0] < horizon), key=lambda r: r[0])[:n_jobs]
    frame = pd.DataFrame({
        "job_id": [f"syn-{i}" for i in range(len(rows))],
        "submit_time": [r[0] for r in rows],
        "duration": [max(10.0, round(r[1], 1)) for r in rows],
        "gpus": [r[2] for r in rows],
        "vc": [r[3].vc for r in rows], "user": [r[3].user for r in rows],
        "name": [r[4] for r in rows], "kind": [r[5] for r in rows],
        "gpu_util": [r[3].gpu_util for r in rows], "mem_util": [r[3].mem_util for r in rows],
        "gpu_mem_mb": [r[3].gpu_mem_mb for r in rows],
    })
    frame.insert(2, "submit_at", pd.Timestamp(start) + pd.to_timedelta(frame["submit_time"], unit="s"))
    return frame
