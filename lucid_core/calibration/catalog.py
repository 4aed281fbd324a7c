"""Write the packing catalog from the journal, in the Lucid artifact's CSV format.

single_data.csv: model,dataset,batchsize,amp,speed,gpu_util,gmem_util,gmem,label (one row per
configuration measured alone; label from its mean co-located normalized speed, never co-located
counts as Jumbo, as in the artifact where jobs too big to share carry label 2).
colocate_info.csv: an unnamed index column, then model/dataset/gpu_num/batchsize/amp/speed for
each job of a pair (speed normalized by the solo speed), then the pair's gpu_util, gmem_util, gmem.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lucid_core.calibration.journal import Journal, SoloRecord
from lucid_core.domain import ShareClass

SINGLE_COLUMNS = ["model", "dataset", "batchsize", "amp", "speed", "gpu_util", "gmem_util", "gmem", "label"]
PAIR_COLUMNS = ["", "model1", "dataset1", "gpu_num1", "batchsize1", "amp1", "speed1", "model2", "dataset2",
                "gpu_num2", "batchsize2", "amp2", "speed2", "gpu_util", "gmem_util", "gmem"]
ENVIRONMENT_NAME = "environment.json"
# how two jobs share the GPU while measured: packing labels hold for one GPU model and one of these
SHARING_MECHANISMS = ("time-slice", "mps")


def sharing_label(mean_speed: float, tiny_threshold: float = 0.95, medium_threshold: float = 0.85) -> ShareClass:
    """Tiny at or above the Tiny threshold, Medium at or above the Medium one, else (or NaN) Jumbo."""
    if math.isnan(mean_speed):
        return ShareClass.JUMBO
    if mean_speed >= tiny_threshold:
        return ShareClass.TINY
    if mean_speed >= medium_threshold:
        return ShareClass.MEDIUM
    return ShareClass.JUMBO


def mean_colocated_speeds(journal: Journal) -> dict[str, float]:
    """Each configuration's mean normalized speed over every pair it was measured in."""
    speeds: dict[str, list[float]] = defaultdict(list)
    for pair in journal.pairs.values():
        speeds[pair.first.key].append(pair.speed_first)
        speeds[pair.second.key].append(pair.speed_second)
    return {key: sum(v) / len(v) for key, v in speeds.items()}


def catalog_speed(record: SoloRecord) -> float:
    """The artifact's speed column: samples per second (env steps per second for RL workloads)."""
    return record.samples_per_s if record.config.info.unit == "iteration" else record.iters_per_s


@dataclass(frozen=True)
class CatalogFiles:
    single: Path
    colocate: Path
    rows: int
    pairs: int


def write_catalog(journal: Journal, directory: str | Path, tiny_threshold: float = 0.95,
                  medium_threshold: float = 0.85) -> CatalogFiles:
    """Derive both CSVs from the journal (atomically replaced), ordered by configuration key."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    means = mean_colocated_speeds(journal)
    single_rows = []
    for key in sorted(journal.solos):
        solo = journal.solos[key]
        label = sharing_label(means.get(key, math.nan), tiny_threshold, medium_threshold)
        single_rows.append([solo.config.model, solo.config.dataset, solo.config.batch_size, int(solo.config.amp),
                            f"{catalog_speed(solo):.3f}", f"{solo.gpu_util:.3f}", f"{solo.mem_util:.3f}",
                            f"{float(round(solo.gpu_mem_mb)):.1f}", int(label)])
    pair_rows = []
    for index, key in enumerate(sorted(journal.pairs)):
        p = journal.pairs[key]
        pair_rows.append([index,
                          p.first.model, p.first.dataset, 1, p.first.batch_size, int(p.first.amp),
                          f"{p.speed_first:.3f}",
                          p.second.model, p.second.dataset, 1, p.second.batch_size, int(p.second.amp),
                          f"{p.speed_second:.3f}",
                          f"{p.gpu_util:.3f}", f"{p.mem_util:.3f}", round(p.gpu_mem_mb)])
    single = _write_csv(directory / "single_data.csv", SINGLE_COLUMNS, single_rows)
    colocate = _write_csv(directory / "colocate_info.csv", PAIR_COLUMNS, pair_rows)
    return CatalogFiles(single, colocate, len(single_rows), len(pair_rows))


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    tmp.replace(path)
    return path


def write_environment(directory: str | Path, environment: Mapping[str, Any]) -> Path:
    """Record what the catalog was measured on (GPU model, sharing, driver, torch, emulated or not) beside it."""
    path = Path(directory) / ENVIRONMENT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(dict(environment), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def catalog_sharing_key(directory: str | Path) -> tuple[str | None, str | None]:
    """(gpu_model, sharing) a catalog was measured under, from its environment.json: what its labels hold for.

    Catalogs written before these keys existed give the first of their "gpus" and no sharing (None);
    a missing or unreadable file gives (None, None).
    """
    try:
        environment = json.loads((Path(directory) / ENVIRONMENT_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None, None
    if not isinstance(environment, dict):
        return None, None
    model = environment.get("gpu_model")
    if not isinstance(model, str) or not model:
        gpus = environment.get("gpus")
        first = gpus[0] if isinstance(gpus, list) and gpus else None
        model = first if isinstance(first, str) and first else None
    sharing = environment.get("sharing")
    return model, sharing if isinstance(sharing, str) and sharing else None
