"""Where the reference data lives and how its files become frames the models train on."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pandas as pd

from lucid_core.paths import REPO_ROOT


def shared_data_dir() -> Path:
    """The shared reference data: $LUCID_SHARED_DATA, else <repo>/../shared/data (never copied in)."""
    return Path(os.environ.get("LUCID_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def file_sha256(path: str | Path) -> str:
    """Content hash of a training file, recorded with every model trained on it."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def frame_sha256(frame: pd.DataFrame) -> str:
    """Content hash of a training frame (row order and values), for frames built in memory."""
    hashed = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    return hashlib.sha256(hashed.tobytes() + ",".join(map(str, frame.columns)).encode()).hexdigest()


def load_throughput_series(path: str | Path) -> pd.DataFrame:
    """Per-slot submission counts indexed by slot start time (the Venus cluster_throughput format)."""
    frame = pd.read_csv(path, parse_dates=["time"])
    return frame.set_index("time").sort_index()


def load_philly_jobs(path: str | Path) -> pd.DataFrame:
    """Philly jobs as a duration-model frame: VC stands in for the user, there are no names."""
    raw = pd.read_csv(path, parse_dates=["timestamp"])
    raw = raw.sort_values("timestamp", kind="stable").reset_index(drop=True)
    epoch = raw["timestamp"].min().normalize()
    return pd.DataFrame({
        "job_id": [f"philly-{i}" for i in range(len(raw))],
        "submit_time": (raw["timestamp"] - epoch).dt.total_seconds().to_numpy(),
        "submit_at": raw["timestamp"],
        "duration": raw["duration"].astype(float),
        "gpus": raw["num_gpus"].astype(int),
        "vc": raw["cluster"].astype(str),
        "user": raw["cluster"].astype(str),
        "name": "",
    })
