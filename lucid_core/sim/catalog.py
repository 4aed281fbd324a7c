"""Workload catalog: single-GPU profiles and co-located speeds that trace jobs are mapped to.

Traces carry no model type, so (as in the paper's simulations) each job is mapped, seeded and
stratified by its size and length, to a measured model configuration. The catalog reads the Lucid
artifact's format (`single_data.csv` + `colocate_info.csv`) or generates a small synthetic one.

Co-located speeds. `speed[i, j]` is the normalized speed of workload i while sharing a GPU with j
(co-located throughput / exclusive throughput). Measured pairs are matched on
model/dataset/batchsize/amp whatever the row order, duplicates (also across GPU counts, which the
paper found to behave alike) are averaged, and speeds are capped at 1.0. A pair never measured
falls back, in order, to:

1. the mean measured speed of a label-`a` workload next to a label-`b` one (labels are the
   catalog's sharing scores, 0 Tiny / 1 Medium / 2 Jumbo), when that label pair was measured;
2. proportional sharing of the GPU: each keeps ``min(1, 100 / (util_i + util_j))`` of its speed.
"""

from __future__ import annotations

import csv
import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lucid_core.domain import pair_speed_problem
from lucid_core.sim.records import TraceRecord, Workload

if TYPE_CHECKING:
    from lucid_core.models.packing import PackingCatalog, PackingTree

SINGLE_FILE = "single_data.csv"
COLOCATE_FILE = "colocate_info.csv"
SINGLE_COLUMNS = ("model", "dataset", "batchsize", "amp", "speed", "gpu_util", "gmem_util", "gmem", "label")
COLOCATE_COLUMNS = ("", "model1", "dataset1", "gpu_num1", "batchsize1", "amp1", "speed1", "model2", "dataset2",
                    "gpu_num2", "batchsize2", "amp2", "speed2", "gpu_util", "gmem_util", "gmem")
TINY_SPEED, MEDIUM_SPEED = 0.95, 0.85  # the artifact's label thresholds on mean co-located speed

# Stratification of the job -> workload mapping. Bounds are fixed (not quantiles of the trace) so a
# job maps to the same workload whatever window of the trace is read.
SIZE_BOUNDS_GPUS = (1, 7)  # strata: 1 GPU, 2-7 GPUs, 8+ GPUs
LENGTH_BOUNDS_S = (600.0, 3 * 3600.0)  # strata: <= 10 min, <= 3 h, longer
HEAVY_TILT_PER_STRATUM = 0.7  # log-odds per stratum step in favour of heavier (higher GPU util) workloads


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One measured model configuration: the artifact's `single_data.csv` row."""

    model: str
    dataset: str
    batchsize: int
    amp: bool
    throughput: float  # exclusive samples/s (the artifact's `speed` column)
    gpu_util: float
    gmem_util: float
    gmem_mb: float
    label: int | None

    @property
    def key(self) -> str:
        return workload_key(self.model, self.dataset, self.batchsize, self.amp)

    @property
    def workload(self) -> Workload:
        return Workload(self.key, self.gpu_util, self.gmem_util, self.gmem_mb, self.amp, self.label)


def workload_key(model: str, dataset: str, batchsize: int, amp: bool) -> str:
    """Canonical workload key, e.g. ``ResNet18/CIFAR-10/bs64/amp0``."""
    return f"{model}/{dataset}/bs{int(batchsize)}/amp{int(bool(amp))}"


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "1.0", "yes"):
        return True
    if value in ("0", "false", "0.0", "no", ""):
        return False
    raise ValueError(f"not a boolean amp flag: {text!r}")


def _label_of_speed(mean_speed: float) -> int:
    return 0 if mean_speed >= TINY_SPEED else 1 if mean_speed >= MEDIUM_SPEED else 2


def _unit_hash(seed: int, text: str) -> float:
    """A uniform number in [0, 1) that depends only on the seed and the text (stable across runs)."""
    digest = hashlib.blake2b(f"{seed}\x1f{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def stratum_of(gpus: int, duration: float) -> tuple[int, int]:
    """(size stratum, length stratum) of a job, each 0 (small/short) .. 2 (wide/long)."""
    size = 0 if gpus <= SIZE_BOUNDS_GPUS[0] else 1 if gpus <= SIZE_BOUNDS_GPUS[1] else 2
    length = 0 if duration <= LENGTH_BOUNDS_S[0] else 1 if duration <= LENGTH_BOUNDS_S[1] else 2
    return size, length


class WorkloadCatalog:
    """Model configurations with exclusive profiles and a dense co-located speed matrix."""

    def __init__(self, entries: Sequence[CatalogEntry], speed_sums: np.ndarray | None = None,
                 speed_counts: np.ndarray | None = None, synthetic: bool = False, source: str = "") -> None:
        if not entries:
            raise ValueError("a workload catalog needs at least one entry")
        self.entries = list(entries)
        self.synthetic = synthetic
        self.source = source
        n = len(self.entries)
        self.index_ = {entry.key: i for i, entry in enumerate(self.entries)}
        if len(self.index_) != n:
            raise ValueError("workload catalog entries must have distinct model/dataset/batchsize/amp")
        sums = np.zeros((n, n)) if speed_sums is None else np.asarray(speed_sums, dtype=float)
        counts = np.zeros((n, n)) if speed_counts is None else np.asarray(speed_counts, dtype=float)
        self.measured_ = counts > 0
        measured_speed = np.minimum(np.divide(sums, counts, out=np.ones((n, n)), where=self.measured_), 1.0)
        self.labels_ = self._labels(measured_speed)
        self.label_pair_speed_ = self._label_pair_means(measured_speed)
        fallback = self._fallback_matrix()
        self.speed_ = np.where(self.measured_, measured_speed, fallback)
        self._speed_rows: list[list[float]] = self.speed_.tolist()  # plain floats: the engine's hot path
        self.workloads_ = [
            Workload(e.key, e.gpu_util, e.gmem_util, e.gmem_mb, e.amp, int(lab) if lab >= 0 else None)
            for e, lab in zip(self.entries, self.labels_, strict=True)
        ]
        self._heaviness = self._heaviness_scores()
        self._packing_tree: PackingTree | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_artifact(cls, directory: str | Path) -> WorkloadCatalog:
        """Read `single_data.csv` and `colocate_info.csv` in the Lucid artifact's format."""
        directory = Path(directory)
        entries = _read_single(directory / SINGLE_FILE)
        index = {entry.key: i for i, entry in enumerate(entries)}
        sums, counts = _read_colocate(directory / COLOCATE_FILE, index)
        return cls(entries, sums, counts, synthetic=False, source=str(directory))

    @classmethod
    def synthetic(cls, seed: int = 0) -> WorkloadCatalog:
        """A small generated catalog (no measurement behind it) for the embedded default demo."""
        rng = np.random.default_rng(seed)
        entries: list[CatalogEntry] = []
        for model, dataset, base_util, bandwidth, base_mem, mem_per_sample, rate in _SYNTHETIC_FAMILIES:
            for batchsize in (32, 128):
                for amp in (False, True):
                    scale = (batchsize / 32) ** 0.35 * (0.8 if amp else 1.0)
                    util = float(np.clip(base_util * scale + rng.normal(0, 2.0), 3.0, 100.0))
                    gmem_util = float(np.clip(util * bandwidth + rng.normal(0, 1.0), 0.0, 100.0))
                    gmem = base_mem + mem_per_sample * batchsize * (0.7 if amp else 1.0)
                    throughput = rate * batchsize / 32 * (1.3 if amp else 1.0)
                    entries.append(CatalogEntry(model, dataset, batchsize, amp, round(throughput, 3),
                                                round(util, 3), round(gmem_util, 3), round(gmem, 1), None))
        n = len(entries)
        util = np.array([e.gpu_util for e in entries]) / 100
        bandwidth = np.array([e.gmem_util for e in entries]) / 100
        combined = util[:, None] + util[None, :]
        # a job slows down when the pair oversubscribes the GPU, more so the more it uses the GPU itself
        speed = (1.0 - 0.45 * np.sqrt(util[:, None]) * util[None, :] * np.maximum(0.0, combined - 0.7)
                 - 0.15 * bandwidth[:, None] * bandwidth[None, :] + rng.normal(0, 0.015, (n, n)))
        speed = np.clip(speed, 0.3, 1.0)
        labels = [_label_of_speed(float(row.mean())) for row in speed]
        entries = [CatalogEntry(e.model, e.dataset, e.batchsize, e.amp, e.throughput, e.gpu_util, e.gmem_util,
                                e.gmem_mb, label) for e, label in zip(entries, labels, strict=True)]
        return cls(entries, speed, np.ones((n, n)), synthetic=True, source=f"synthetic(seed={seed})")

    def to_csv(self, directory: str | Path) -> tuple[Path, Path]:
        """Write the catalog in the artifact's two-file format (measured pairs only)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        single, colocate = directory / SINGLE_FILE, directory / COLOCATE_FILE
        with open(single, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(SINGLE_COLUMNS)
            for e, label in zip(self.entries, self.labels_, strict=True):
                writer.writerow([e.model, e.dataset, e.batchsize, int(e.amp), e.throughput, e.gpu_util,
                                 e.gmem_util, e.gmem_mb, "" if label < 0 else int(label)])
        with open(colocate, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(COLOCATE_COLUMNS)
            row = 0
            for i, a in enumerate(self.entries):
                for j in range(i, len(self.entries)):
                    if not self.measured_[i, j]:
                        continue
                    b = self.entries[j]
                    s_ab, s_ba = round(float(self.speed_[i, j]), 3), round(float(self.speed_[j, i]), 3)
                    util = min(100.0, a.gpu_util * s_ab + b.gpu_util * s_ba)
                    bandwidth = min(100.0, a.gmem_util * s_ab + b.gmem_util * s_ba)
                    writer.writerow([row, a.model, a.dataset, 1, a.batchsize, int(a.amp), s_ab, b.model, b.dataset,
                                     1, b.batchsize, int(b.amp), s_ba, round(util, 3), round(bandwidth, 3),
                                     round(a.gmem_mb + b.gmem_mb, 1)])
                    row += 1
        return single, colocate

    # ------------------------------------------------------------------ lookups
    @property
    def workloads(self) -> list[Workload]:
        return list(self.workloads_)

    def __len__(self) -> int:
        return len(self.entries)

    def packing_tree(self) -> PackingTree:
        """The packing tree trained from this catalog, as `lucid models train-packing` trains it: the
        simulator labels jobs with what this catalog's GPU, shared its way, measured (never a fixed rule)."""
        if self._packing_tree is None:
            from lucid_core.models.packing import PackingTree

            path = self.packing_tree_cache_path()
            tree = _cached_tree(path)
            if tree is None:
                tree = PackingTree().fit_catalog(self.packing_catalog())
                if self.packing_tree_cache_path() == path:  # kept only if its files did not change while it was
                    _save_tree(tree, path)                  # read for the fit: never under another content's key
            self._packing_tree = tree
        return self._packing_tree

    def packing_tree_cache_path(self) -> Path:
        """Where the tree fitted on this catalog is kept: keyed by its folder's two files as they are (read
        without pandas, so a run that finds its tree kept never imports it), else by its trainer form."""
        folder = self._catalog_folder()
        if folder is None:
            return _frames_cache_path(self.packing_catalog())
        return _tree_cache_path([b"files", (folder / SINGLE_FILE).read_bytes(), (folder / COLOCATE_FILE).read_bytes()])

    def _catalog_folder(self) -> Path | None:
        """The measured folder this catalog was read from; None for a synthetic one."""
        folder = Path(self.source) if self.source and not self.synthetic else None
        if folder is not None and (folder / SINGLE_FILE).is_file() and (folder / COLOCATE_FILE).is_file():
            return folder
        return None

    def packing_catalog(self) -> PackingCatalog:
        """Profiles and measured pairs in the packing trainer's form (read again from the folder it came from)."""
        from lucid_core.models.packing import PackingCatalog, load_packing_catalog

        folder = self._catalog_folder()
        if folder is not None:
            return load_packing_catalog(folder)
        import pandas as pd

        measured = self.measured_
        mean = [float(self.speed_[i][measured[i]].mean()) if measured[i].any() else math.nan
                for i in range(len(self.entries))]
        profiles = pd.DataFrame({
            "key": [e.key for e in self.entries], "gpu_util": [e.gpu_util for e in self.entries],
            "mem_util": [e.gmem_util for e in self.entries], "gpu_mem_mb": [e.gmem_mb for e in self.entries],
            "amp": [int(e.amp) for e in self.entries], "mean_speed": mean,
            "catalog_label": [int(lab) if lab >= 0 else math.nan for lab in self.labels_]})
        rows = [(self.entries[i].key, self.entries[j].key, float(self.speed_[i, j]), float(self.speed_[j, i]))
                for i in range(len(self.entries)) for j in range(i, len(self.entries)) if measured[i, j]]
        pairs = pd.DataFrame(rows, columns=["key1", "key2", "speed1", "speed2"])
        return PackingCatalog(profiles=profiles, pairs=pairs)

    def colocated_speeds(self, first: Workload, second: Workload) -> tuple[float, float]:
        """Normalized speeds (first, second) of two workloads sharing one GPU, each <= 1."""
        i, j = self.index_.get(first.key), self.index_.get(second.key)
        if i is not None and j is not None:
            return self._speed_rows[i][j], self._speed_rows[j][i]
        return self._fallback_speed(first, second), self._fallback_speed(second, first)

    def mean_colocated_speed(self, workload: Workload) -> float:
        """Mean speed of a workload over all partners in the catalog (what its label is derived from)."""
        i = self.index_.get(workload.key)
        if i is not None:
            return float(self.speed_[i].mean())
        return float(np.mean([self._fallback_speed(workload, other) for other in self.workloads_]))

    def assign(self, records: Sequence[TraceRecord], seed: int = 0) -> list[Workload]:
        """Map each job to a workload, seeded and stratified by size and length.

        Within a stratum a workload is drawn with probability proportional to
        ``exp(tilt * z)``, `z` its standardized GPU utilization and ``tilt = 0.7 * (size + length - 1)``
        (strata 0..2, see `stratum_of`): short 1-GPU jobs lean to light workloads, long wide ones to
        heavy ones (BERT, ResNet-50). The draw of a job depends only on the seed, its stratum and its
        identity: jobs with a user and name (recurring submissions) share one draw per stratum, as a
        re-submitted script runs the same model; other jobs draw by job id.
        """
        cumulative = self._stratum_cdfs()
        count = len(records)
        strata = np.empty(count, dtype=int)
        draws = np.empty(count)
        for k, record in enumerate(records):
            size, length = stratum_of(record.gpus, record.duration)
            strata[k] = 3 * size + length
            identity = f"{record.user}\x1e{record.name}" if record.name else f"id\x1e{record.job_id}"
            draws[k] = _unit_hash(seed, identity)
        picks = np.empty(count, dtype=int)
        for stratum in np.unique(strata):
            mask = strata == stratum
            picks[mask] = np.searchsorted(cumulative[stratum // 3, stratum % 3], draws[mask], side="right")
        last = len(self.workloads_) - 1
        return [self.workloads_[min(int(i), last)] for i in picks]

    # ------------------------------------------------------------------ internals
    def _labels(self, measured_speed: np.ndarray) -> np.ndarray:
        labels = np.full(len(self.entries), -1, dtype=int)
        for i, entry in enumerate(self.entries):
            if entry.label is not None:
                labels[i] = entry.label
            elif self.measured_[i].any():
                labels[i] = _label_of_speed(float(measured_speed[i][self.measured_[i]].mean()))
        return labels

    def _label_pair_means(self, measured_speed: np.ndarray) -> np.ndarray:
        means = np.full((3, 3), np.nan)
        for a in range(3):
            for b in range(3):
                mask = self.measured_ & (self.labels_[:, None] == a) & (self.labels_[None, :] == b)
                if mask.any():
                    means[a, b] = float(measured_speed[mask].mean())
        return means

    def _fallback_speed(self, first: Workload, second: Workload) -> float:
        a, b = first.label, second.label
        if a is not None and b is not None and 0 <= a < 3 and 0 <= b < 3:
            mean = self.label_pair_speed_[a, b]
            if not math.isnan(mean):
                return float(min(mean, 1.0))
        combined = first.gpu_util + second.gpu_util
        return 1.0 if combined <= 100.0 else 100.0 / combined

    def _fallback_matrix(self) -> np.ndarray:
        n = len(self.entries)
        provisional = [
            Workload(e.key, e.gpu_util, e.gmem_util, e.gmem_mb, e.amp, int(lab) if lab >= 0 else None)
            for e, lab in zip(self.entries, self.labels_, strict=True)
        ]
        matrix = np.ones((n, n))
        for i in range(n):
            for j in range(n):
                if not self.measured_[i, j]:
                    matrix[i, j] = self._fallback_speed(provisional[i], provisional[j])
        return matrix

    def _heaviness_scores(self) -> np.ndarray:
        util = np.array([e.gpu_util for e in self.entries], dtype=float)
        spread = util.std()
        return (util - util.mean()) / spread if spread > 0 else np.zeros_like(util)

    def _stratum_cdfs(self) -> np.ndarray:
        cdfs = np.empty((3, 3, len(self.entries)))
        for size in range(3):
            for length in range(3):
                tilt = HEAVY_TILT_PER_STRATUM * (size + length - 1)
                weights = np.exp(tilt * self._heaviness)
                cdfs[size, length] = np.cumsum(weights) / weights.sum()
        return cdfs


# Synthetic families: model, dataset, GPU util % at bs32, memory-bandwidth / util ratio, base memory MB,
# memory MB per sample, exclusive samples/s at bs32. Invented numbers in the range of common models.
_SYNTHETIC_FAMILIES = (
    ("SynMLP", "SynTabular", 8.0, 0.15, 1900.0, 2.0, 9000.0),
    ("SynRL", "SynGym", 13.0, 0.05, 2000.0, 1.0, 40.0),
    ("SynCNN-S", "SynImages32", 40.0, 0.45, 2200.0, 12.0, 1500.0),
    ("SynRNN", "SynText", 60.0, 0.75, 3000.0, 20.0, 3500.0),
    ("SynCNN-L", "SynImages224", 88.0, 0.8, 3500.0, 70.0, 450.0),
    ("SynTransformer", "SynCorpus", 96.0, 0.65, 9000.0, 90.0, 110.0),
)


def _read_single(path: Path) -> list[CatalogEntry]:
    entries = []
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in SINGLE_COLUMNS if c != "label" and c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: not a single-GPU profile file, missing columns {missing}")
        for line, row in enumerate(reader, start=2):
            try:
                short = [c for c in SINGLE_COLUMNS if c != "label" and row.get(c) is None]
                if short:
                    raise ValueError(f"the row has no cell for {short}")
                label_text = (row.get("label") or "").strip()
                entry = CatalogEntry(
                    row["model"].strip(), row["dataset"].strip(), int(float(row["batchsize"])), _flag(row["amp"]),
                    float(row["speed"]), float(row["gpu_util"]), float(row["gmem_util"]), float(row["gmem"]),
                    int(float(label_text)) if label_text else None)
                _check_single(entry)
                entries.append(entry)
            except (TypeError, ValueError) as error:
                raise ValueError(f"{path}: line {line}: {error}") from None
    return entries


def _check_single(entry: CatalogEntry) -> None:
    """A measured exclusive profile's values in the range they can have: a zero speed would make every job of
    the workload run for ever, a utilization over 100% is no percentage (and fails the policy's profile check
    mid-run, with every policy simulated so far thrown away)."""
    if not (entry.throughput > 0 and math.isfinite(entry.throughput)):
        raise ValueError(f"speed {entry.throughput} is not a positive number")
    for name, value in (("gpu_util", entry.gpu_util), ("gmem_util", entry.gmem_util)):
        if not 0 <= value <= 100:
            raise ValueError(f"{name} {value} is not a percentage in [0, 100]")
    if not (entry.gmem_mb >= 0 and math.isfinite(entry.gmem_mb)):
        raise ValueError(f"gmem {entry.gmem_mb} is not a memory size >= 0 MB")
    if entry.batchsize < 1:
        raise ValueError(f"batchsize {entry.batchsize} is not >= 1")


def _read_colocate(path: Path, index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    n = len(index)
    sums, counts = np.zeros((n, n)), np.zeros((n, n))
    if not path.exists():
        return sums, counts
    with open(path, encoding="utf-8-sig", newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                i = index.get(workload_key(row["model1"], row["dataset1"], int(float(row["batchsize1"])),
                                           _flag(row["amp1"])))
                j = index.get(workload_key(row["model2"], row["dataset2"], int(float(row["batchsize2"])),
                                           _flag(row["amp2"])))
                s1, s2 = float(row["speed1"]), float(row["speed2"])
            except (KeyError, TypeError, ValueError) as error:
                raise ValueError(f"{path}: line {line}: {error}") from None
            problem = pair_speed_problem(s1, s2)
            if problem is not None:
                raise ValueError(f"{path}: line {line}: {problem}")
            if i is None or j is None or not (math.isfinite(s1) and math.isfinite(s2)):
                continue  # a pair of workloads the profile file does not list: unusable
            sums[i, j] += s1  # averaged over duplicates first, capped at 1.0 after (in the catalog)
            counts[i, j] += 1
            sums[j, i] += s2
            counts[j, i] += 1
    return sums, counts


def _frames_cache_path(catalog: PackingCatalog) -> Path:
    """Where the tree fitted on `catalog` (a synthetic catalog's trainer form) is kept between runs: keyed by its
    profiles and pairs and by the trainer's source, so a changed catalog or trainer fits anew (a fit is
    deterministic: the kept tree is the one a fit would give). Under $XDG_CACHE_HOME (default
    ~/.cache)/lucid/packing-trees."""
    return _tree_cache_path([b"frames", catalog.profiles.to_csv(index=False).encode(),
                             catalog.pairs.to_csv(index=False).encode()])


def _tree_cache_path(parts: list[bytes]) -> Path:
    """The kept tree's path for a catalog given as byte strings, with the trainer's source in the key."""
    import lucid_core.models.packing as trainer

    digest = hashlib.sha256(Path(trainer.__file__).read_bytes())
    for part in parts:  # each length-prefixed: two catalogs never run together into one key
        digest.update(len(part).to_bytes(8, "big") + part)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "lucid" / "packing-trees" / f"{digest.hexdigest()[:32]}.json"


def _cached_tree(path: Path) -> PackingTree | None:
    """The tree kept at `path`; None when there is none or it cannot be read (it is fitted again then)."""
    from lucid_core.models.packing import PackingTree

    try:
        return PackingTree.load_json(path)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _save_tree(tree: PackingTree, path: Path) -> None:
    """Keep a fitted tree for the next run (atomically: parallel runs may fit the same one); best effort."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        tree.save_json(partial)
        os.replace(partial, path)
    except OSError:
        pass
