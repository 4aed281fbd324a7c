"""Compare a measured catalog's labels with a reference catalog's (e.g. the artifact's RTX 3090 labels).

Configurations match on (model, batch size, AMP); the dataset column differs by design (ours
are generated stand-ins). Labels measured on one GPU and software stack need not hold on
another, which is the point of calibrating: the comparison shows where they differ.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lucid_core.calibration.journal import Journal
from lucid_core.domain import ShareClass

NAMES = {int(c): c.name.title() for c in ShareClass}


@dataclass(frozen=True)
class LabelRow:
    model: str
    batch_size: int
    amp: int
    label: int
    gpu_util: float
    mem_util: float
    gpu_mem_mb: float
    speed: float


def read_labels(path: str | Path) -> dict[tuple[str, int, int], LabelRow]:
    """Rows of a single_data.csv keyed by (model, batch size, amp)."""
    out = {}
    with Path(path).open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            key = (row["model"], int(row["batchsize"]), int(row["amp"]))
            out[key] = LabelRow(key[0], key[1], key[2], int(row["label"]), float(row["gpu_util"]),
                                float(row["gmem_util"]), float(row["gmem"]), float(row["speed"]))
    return out


@dataclass(frozen=True)
class Comparison:
    matched: list[tuple[LabelRow, LabelRow]]  # (ours, reference)
    unmatched: list[LabelRow]  # ours with no reference row

    @property
    def agreement(self) -> float:
        return sum(a.label == b.label for a, b in self.matched) / len(self.matched) if self.matched else float("nan")


def compare_labels(catalog_dir: str | Path, reference: str | Path) -> Comparison:
    ours = read_labels(Path(catalog_dir) / "single_data.csv")
    ref = read_labels(reference)
    matched = [(row, ref[key]) for key, row in sorted(ours.items()) if key in ref]
    unmatched = [row for key, row in sorted(ours.items()) if key not in ref]
    return Comparison(matched, unmatched)


def comparison_markdown(comparison: Comparison, catalog_dir: str | Path, reference: str | Path) -> str:
    """A table per configuration (our profile and label beside the reference's) and the agreement."""
    means = {}
    journal = Journal.open(catalog_dir)
    for pair in journal.pairs.values():
        for cfg, speed in ((pair.first, pair.speed_first), (pair.second, pair.speed_second)):
            means.setdefault((cfg.model, cfg.batch_size, int(cfg.amp)), []).append(speed)
    lines = [f"Labels of `{catalog_dir}` against `{reference}` (matched on model, batch size, AMP).", "",
             "| model | batch | AMP | UG % | UM % | MG MB | mean co-located speed | label | reference UG % "
             "| reference MG MB | reference label | same |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for ours, ref in comparison.matched:
        speeds = means.get((ours.model, ours.batch_size, ours.amp), [])
        mean = f"{sum(speeds) / len(speeds):.3f} ({len(speeds)} measurements)" if speeds else "never co-located"
        lines.append(f"| {ours.model} | {ours.batch_size} | {ours.amp} | {ours.gpu_util:.1f} | {ours.mem_util:.1f} "
                     f"| {ours.gpu_mem_mb:.0f} | {mean} | {NAMES[ours.label]} | {ref.gpu_util:.1f} "
                     f"| {ref.gpu_mem_mb:.0f} | {NAMES[ref.label]} | {'yes' if ours.label == ref.label else 'no'} |")
    same = sum(a.label == b.label for a, b in comparison.matched)
    lines += ["", f"Same label for {same} of {len(comparison.matched)} matched configurations."]
    if comparison.unmatched:
        names = ", ".join(f"{r.model} b{r.batch_size} amp{r.amp}" for r in comparison.unmatched)
        lines.append(f"No reference row for: {names}.")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lucid_core.calibration.compare", description=__doc__)
    parser.add_argument("--catalog", required=True, help="directory with single_data.csv and measurements.jsonl")
    parser.add_argument("--reference", required=True, help="reference single_data.csv")
    parser.add_argument("--out", default=None, help="write the Markdown here as well as to stdout")
    args = parser.parse_args(argv)
    text = comparison_markdown(compare_labels(args.catalog, args.reference), args.catalog, args.reference)
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
