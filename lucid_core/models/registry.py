"""Model registry: versioned artifacts (joblib) with JSON metadata, one promoted version per name.

Layout: <root>/<name>/v0001/{model.joblib, meta.json}; <root>/<name>/PROMOTED holds the version.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import lucid_core
from lucid_core.paths import REPO_ROOT


def code_version() -> str:
    """lucid_core version plus the git commit when the code runs from a checkout."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{lucid_core.__version__}+g{sha}" if sha else lucid_core.__version__


@dataclass(frozen=True)
class ModelVersion:
    """Metadata of one registered artifact."""

    name: str
    version: int
    kind: str
    created_at: str
    training_window: tuple[str, str]
    data_hash: str
    metrics: dict[str, float]
    code_version: str
    params: dict[str, Any] = field(default_factory=dict)
    promoted: bool = False


def models_root() -> Path:
    """LUCID_HOME/models: the one directory a live round loads promoted artifacts from. The Update Engine's
    registry and `lucid models train-packing --promote`'s default registry lie in it."""
    from lucid_core.config import lucid_home

    return lucid_home() / "models"


def artifact_within(path: str | Path, root: str | Path) -> Path:
    """`path` resolved (through links), if it lies under `root` (resolved too); ValueError otherwise. A store's
    model_versions row is written by whoever can write the store, and loading a joblib file runs its code: only
    files under the models root, which the file system guards, may be loaded from a row."""
    text = str(path)
    if not text or "\x00" in text:
        raise ValueError(f"model artifact path {text!r} is not a path")
    try:
        resolved, base = Path(text).resolve(), Path(root).resolve()
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError from pathlib): no file to load
        raise ValueError(f"model artifact path {text!r} is not a path (it loops through links)") from None
    if not resolved.is_relative_to(base):
        raise ValueError(f"model artifact {text} lies outside the models root {base}; a round loads only "
                         f"artifacts under it (LUCID_HOME/models)")
    return resolved


def load_artifact(path: str | Path) -> Any:
    """joblib.load of `path` if it is a regular file (through links): one replaced by a FIFO, or by a link to
    one, blocked its reader for ever (every live round hung loading the promoted model); ValueError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, with no writer, instead of waiting
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ValueError(f"model artifact {path} is not a regular file")
        import joblib  # here, not at the top: naming the models root must not cost its import

        return joblib.load(file)


def _version_folder(name: str) -> bool:
    """Whether a folder name is a version's ("v" and ASCII digits: "v²" passes `isdigit` and fails `int`)."""
    digits = name[1:]
    return name.startswith("v") and digits.isascii() and digits.isdigit()


class ModelRegistry:
    """Save, list, compare, promote and load model versions under one directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _dir(self, name: str, version: int) -> Path:
        return self.root / name / f"v{version:04d}"

    def artifact_path(self, name: str, version: int) -> Path:
        """Where a version's model file lies (what a store's model_versions row points to)."""
        return self._dir(name, version).resolve() / "model.joblib"

    def versions(self, name: str) -> list[int]:
        folder = self.root / name
        if not folder.is_dir():
            return []
        return sorted(int(p.name[1:]) for p in folder.iterdir() if p.is_dir() and _version_folder(p.name))

    def register(self, name: str, model: Any, *, kind: str, training_window: tuple[str, str], data_hash: str,
                 metrics: dict[str, float], params: dict[str, Any] | None = None) -> ModelVersion:
        """Store a new version (never overwrites) and return its metadata."""
        existing = self.versions(name)
        version = (existing[-1] + 1) if existing else 1
        folder = self._dir(name, version)
        folder.mkdir(parents=True, exist_ok=False)
        import joblib

        joblib.dump(model, folder / "model.joblib")
        meta = ModelVersion(name=name, version=version, kind=kind, created_at=datetime.now(UTC).isoformat(),
                            training_window=(str(training_window[0]), str(training_window[1])),
                            data_hash=data_hash, metrics={k: float(v) for k, v in metrics.items()},
                            code_version=code_version(), params=dict(params or {}))
        (folder / "meta.json").write_text(json.dumps(asdict(meta), indent=1, default=str) + "\n")
        return meta

    def metadata(self, name: str, version: int) -> ModelVersion:
        data = json.loads((self._dir(name, version) / "meta.json").read_text())
        data["training_window"] = tuple(data["training_window"])
        data["promoted"] = self.promoted_version(name) == version
        return ModelVersion(**data)

    def promote(self, name: str, version: int) -> None:
        if version not in self.versions(name):
            raise KeyError(f"{name} has no version {version}")
        tmp = self.root / name / "PROMOTED.tmp"
        tmp.write_text(f"{version}\n")
        tmp.replace(self.root / name / "PROMOTED")  # atomic: a reader never sees a half-written pointer

    def promoted_version(self, name: str) -> int | None:
        """The version PROMOTED names; None when there is none or it names no version number (a hand edit, a
        file another writer replaced): one unreadable pointer failed every later Update Engine run."""
        pointer = self.root / name / "PROMOTED"
        try:
            text = pointer.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:  # absent, or not a file
            return None
        return int(text) if text.isascii() and text.isdigit() else None

    def load(self, name: str, version: int | None = None) -> Any:
        """The given version, else the promoted one."""
        if version is None:
            version = self.promoted_version(name)
            if version is None:
                raise LookupError(f"no promoted version of {name!r} in {self.root}")
        return load_artifact(self._dir(name, version) / "model.joblib")

    def list(self, name: str | None = None) -> list[ModelVersion]:
        if name:
            names = [name]
        else:
            names = sorted(p.name for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []
        return [self.metadata(n, v) for n in names for v in self.versions(n)]

    def compare(self, name: str, a: int, b: int) -> dict[str, tuple[float | None, float | None]]:
        """Metric -> (value in a, value in b) for every metric either version recorded."""
        ma, mb = self.metadata(name, a).metrics, self.metadata(name, b).metrics
        return {k: (ma.get(k), mb.get(k)) for k in sorted(set(ma) | set(mb))}
