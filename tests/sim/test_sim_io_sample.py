"""Embedded sample: deterministic, realistic in shape, readable, and the committed files are current."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from lucid_core.sim.catalog import WorkloadCatalog
from lucid_core.sim.sample import generate_sample_trace, main, write_sample
from lucid_core.sim.traces import read_trace

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "include" / "sample"


def test_trace_is_deterministic_sized_and_shaped_like_a_gpu_cluster():
    rows = generate_sample_trace(400, seed=7, days=2.0)
    assert rows == generate_sample_trace(400, seed=7, days=2.0)
    assert rows != generate_sample_trace(400, seed=8, days=2.0)
    assert len(rows) == 400 and len({r["job_id"] for r in rows}) == 400
    times = [datetime.fromisoformat(str(r["submit_time"])) for r in rows]
    assert times == sorted(times) and (times[-1] - times[0]).days < 2
    gpus = Counter(int(r["gpus"]) for r in rows)
    assert gpus[1] / len(rows) >= 0.8 and len(gpus) >= 3
    assert len({r["vc"] for r in rows}) >= 3
    names = Counter(str(r["name"]) for r in rows)
    assert len(names) < len(rows) / 2 and names.most_common(1)[0][1] >= 5  # recurring submissions
    assert any("-debug" in n for n in names) and any("-sweep-" in n for n in names)
    assert any("-final-" in n for n in names)
    day = sum(1 for t in times if 9 <= t.hour < 19)
    night = sum(1 for t in times if 0 <= t.hour < 6)
    assert day > 3 * night  # diurnal
    durations = sorted(float(r["duration"]) for r in rows)
    median, p99 = durations[len(durations) // 2], durations[int(0.99 * len(durations))]
    assert p99 > 10 * median  # heavy tail


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        generate_sample_trace(0, seed=1, days=1.0)


def test_sample_is_read_without_problems_and_maps_onto_its_catalog(tmp_path):
    paths = write_sample(tmp_path, n_jobs=50, seed=3, days=0.5)
    assert sorted(p.name for p in paths) == ["colocate_info.csv", "single_data.csv", "trace.csv"]
    trace = read_trace(tmp_path / "trace.csv", "auto")
    assert trace.fmt == "generic" and len(trace.records) == 50 and not trace.problems
    catalog = WorkloadCatalog.from_artifact(tmp_path)
    assert len(catalog.assign(trace.records, seed=0)) == 50


def test_committed_sample_matches_the_generator(tmp_path):
    if not SAMPLE_DIR.exists():
        pytest.skip(f"{SAMPLE_DIR} not present (installed without the source tree)")
    assert main(["--out", str(tmp_path)]) == 0
    for name in ("trace.csv", "single_data.csv", "colocate_info.csv"):
        assert (tmp_path / name).read_bytes() == (SAMPLE_DIR / name).read_bytes(), name
    assert "synthetic" in (SAMPLE_DIR / "README.md").read_text().lower()
