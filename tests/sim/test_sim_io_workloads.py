"""Workload catalog: co-located speed lookups (symmetry, duplicates, caps, fallbacks) and job mapping."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lucid_core.sim.catalog import WorkloadCatalog, stratum_of, workload_key
from lucid_core.sim.records import TraceRecord

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("LUCID_SHARED_DATA", REPO.parent / "shared" / "data"))
ARTIFACT = SHARED_DATA / "lucid_artifact"

SINGLE = """model,dataset,batchsize,amp,speed,gpu_util,gmem_util,gmem,label
A,dA,32,0,100,20.0,5.0,2000,0
B,dB,64,1,50,90.0,60.0,8000,2
C,dC,32,0,70,50.0,30.0,3000,1
D,dD,128,0,10,100.0,80.0,12000,2
"""
COLOCATE_HEADER = (",model1,dataset1,gpu_num1,batchsize1,amp1,speed1,"
                   "model2,dataset2,gpu_num2,batchsize2,amp2,speed2,gpu_util,gmem_util,gmem\n")
COLOCATE = COLOCATE_HEADER + """0,A,dA,1,32,0,0.9,B,dB,1,64,1,0.8,100,60,10000
1,B,dB,2,64,1,0.7,A,dA,2,32,0,1.0,100,60,10000
2,A,dA,1,32,0,1.1,A,dA,1,32,0,1.05,40,10,4000
3,C,dC,1,32,0,0.85,B,dB,1,64,1,0.6,100,80,11000
4,Z,dZ,1,32,0,0.5,A,dA,1,32,0,0.5,100,80,11000
"""


@pytest.fixture
def tiny(tmp_path) -> WorkloadCatalog:
    (tmp_path / "single_data.csv").write_text(SINGLE)
    (tmp_path / "colocate_info.csv").write_text(COLOCATE)
    return WorkloadCatalog.from_artifact(tmp_path)


def by_model(catalog: WorkloadCatalog):
    return {w.key.split("/")[0]: w for w in catalog.workloads}


def test_measured_pairs_average_duplicates_in_either_order_and_cap(tiny):
    w = by_model(tiny)
    assert w["A"].key == workload_key("A", "dA", 32, False) == "A/dA/bs32/amp0"
    # A next to B: 0.9 (row 0) and 1.0 (row 1, reversed order) -> 0.95; B next to A: 0.8, 0.7 -> 0.75
    assert tiny.colocated_speeds(w["A"], w["B"]) == pytest.approx((0.95, 0.75))
    assert tiny.colocated_speeds(w["B"], w["A"]) == pytest.approx((0.75, 0.95))
    # A with A: (1.1 + 1.05) / 2 = 1.075, capped at 1
    assert tiny.colocated_speeds(w["A"], w["A"]) == (1.0, 1.0)
    assert tiny.colocated_speeds(w["C"], w["B"]) == pytest.approx((0.85, 0.6))


def test_unmeasured_pairs_fall_back_to_label_pair_means_then_proportional_share(tiny):
    w = by_model(tiny)
    # D (Jumbo) was never measured; (Jumbo, Tiny) was: B next to A = 0.75, A next to B = 0.95
    assert tiny.colocated_speeds(w["D"], w["A"]) == pytest.approx((0.75, 0.95))
    # (Jumbo, Jumbo) never measured: proportional share 100 / (90 + 100)
    assert tiny.colocated_speeds(w["B"], w["D"]) == pytest.approx((100 / 190, 100 / 190))
    # (Tiny, Medium): A (20%) + C (50%) fit in one GPU -> 1.0
    assert tiny.colocated_speeds(w["A"], w["C"]) == (1.0, 1.0)
    assert tiny.measured_.sum() == 5  # A-B, B-A, A-A, C-B, B-C; the row with unknown Z is ignored


def test_lookups_are_symmetric_and_capped_on_the_measured_catalog():
    if not ARTIFACT.exists():
        pytest.skip(f"Lucid artifact catalog not found at {ARTIFACT} (set LUCID_SHARED_DATA)")
    catalog = WorkloadCatalog.from_artifact(ARTIFACT)
    assert len(catalog) == 66 and not catalog.synthetic
    assert catalog.speed_.max() <= 1.0 and catalog.speed_.min() > 0.0
    workloads = catalog.workloads
    rng = np.random.default_rng(0)
    for i, j in rng.integers(0, len(workloads), size=(200, 2)):
        s1, s2 = catalog.colocated_speeds(workloads[i], workloads[j])
        assert catalog.colocated_speeds(workloads[j], workloads[i]) == (s2, s1)
    # one measured pair recomputed straight from the file
    rows = pd.read_csv(ARTIFACT / "colocate_info.csv", index_col=0)
    first = rows.iloc[0]
    a = next(w for w in workloads if w.key == workload_key(first.model1, first.dataset1, first.batchsize1,
                                                           bool(first.amp1)))
    b = next(w for w in workloads if w.key == workload_key(first.model2, first.dataset2, first.batchsize2,
                                                           bool(first.amp2)))
    keys1 = rows.model1 + rows.dataset1 + rows.batchsize1.astype(str) + rows.amp1.astype(str)
    keys2 = rows.model2 + rows.dataset2 + rows.batchsize2.astype(str) + rows.amp2.astype(str)
    ka = f"{first.model1}{first.dataset1}{first.batchsize1}{first.amp1}"
    kb = f"{first.model2}{first.dataset2}{first.batchsize2}{first.amp2}"
    speeds_a = list(rows.speed1[(keys1 == ka) & (keys2 == kb)]) + list(rows.speed2[(keys2 == ka) & (keys1 == kb)])
    assert catalog.colocated_speeds(a, b)[0] == pytest.approx(min(1.0, float(np.mean(speeds_a))))


def records(n: int, gpus: int, duration: float, prefix: str) -> list[TraceRecord]:
    return [TraceRecord(f"{prefix}{k}", float(k), duration, gpus) for k in range(n)]


def test_assignment_is_seeded_deterministic_and_stratified():
    catalog = WorkloadCatalog.synthetic(3)
    small_short = records(400, 1, 60.0, "s")
    wide_long = records(400, 8, 86400.0, "w")
    jobs = small_short + wide_long
    first = catalog.assign(jobs, seed=11)
    assert first == catalog.assign(jobs, seed=11)
    assert first != catalog.assign(jobs, seed=12)
    assert catalog.assign(jobs[::-1], seed=11) == first[::-1]  # a job's draw does not depend on order
    light = np.mean([w.gpu_util for w in first[:400]])
    heavy = np.mean([w.gpu_util for w in first[400:]])
    assert heavy > light + 20
    assert stratum_of(1, 60.0) == (0, 0) and stratum_of(8, 86400.0) == (2, 2) and stratum_of(4, 3600.0) == (1, 1)


def test_recurring_jobs_share_a_workload_within_a_stratum():
    catalog = WorkloadCatalog.synthetic(3)
    same = [TraceRecord(f"r{k}", float(k), 1800.0, 1, user="u1", name="bert-ft-sweep") for k in range(20)]
    assert len(set(catalog.assign(same, seed=5))) == 1
    other = [TraceRecord(f"o{k}", float(k), 1800.0, 1) for k in range(20)]
    assert len(set(catalog.assign(other, seed=5))) > 1


def test_synthetic_catalog_is_labelled_and_round_trips_through_the_artifact_format(tmp_path):
    catalog = WorkloadCatalog.synthetic(7)
    assert catalog.synthetic and "synthetic" in catalog.source
    assert all(w.key.startswith("Syn") for w in catalog.workloads)
    for w in catalog.workloads:
        mean = catalog.mean_colocated_speed(w)
        assert w.label == (0 if mean >= 0.95 else 1 if mean >= 0.85 else 2)
    assert {w.label for w in catalog.workloads} == {0, 1, 2}
    catalog.to_csv(tmp_path)
    again = WorkloadCatalog.from_artifact(tmp_path)
    assert [w.key for w in again.workloads] == [w.key for w in catalog.workloads]
    assert [w.label for w in again.workloads] == [w.label for w in catalog.workloads]
    assert np.abs(again.speed_ - catalog.speed_).max() <= 0.0005 + 1e-12  # written with 3 decimals
    assert not again.synthetic  # read back from files it is just a catalog; the README says what it is


@pytest.mark.parametrize(("file", "edit", "message"), [
    ("colocate_info.csv", lambda df: df.assign(speed1=0.0), "co-located speeds 0 and"),
    ("colocate_info.csv", lambda df: df.assign(speed2=-1.0), "between 0.01 and 1.5"),
    ("colocate_info.csv", lambda df: df.assign(speed1=1e-9), "between 0.01 and 1.5"),
    ("colocate_info.csv", lambda df: df.assign(speed1=1e9), "co-located speeds 1e\\+09 and .* between 0.01 and 1.5"),
    ("single_data.csv", lambda df: df.assign(gpu_util=150.0), "gpu_util 150.0 is not a percentage"),
    ("single_data.csv", lambda df: df.assign(gmem_util=float("nan")), "gmem_util nan is not a percentage"),
    ("single_data.csv", lambda df: df.assign(speed=0.0), "speed 0.0 is not a positive number"),
    ("single_data.csv", lambda df: df.assign(gmem=-5.0), "gmem -5.0 is not a memory size"),
])
def test_a_catalog_value_out_of_its_range_is_refused_naming_file_and_line(tmp_path, file, edit, message):
    """A zero co-located speed divided by zero mid-run, a negative one gave a negative JCT, a utilization of 150%
    failed only when Lucid's turn came: each is refused when the catalog is read."""
    WorkloadCatalog.synthetic(7).to_csv(tmp_path)
    path = tmp_path / file
    edit(pd.read_csv(path)).to_csv(path, index=False, na_rep="nan")
    with pytest.raises(ValueError, match=f"{file}: line 2: .*{message}"):
        WorkloadCatalog.from_artifact(tmp_path)


def test_a_short_row_in_the_profiles_is_refused_naming_its_line(tmp_path):
    WorkloadCatalog.synthetic(7).to_csv(tmp_path)
    path = tmp_path / "single_data.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, "SynMLP"]) + "\n")
    with pytest.raises(ValueError, match=rf"single_data.csv: line {len(lines) + 1}: the row has no cell for"):
        WorkloadCatalog.from_artifact(tmp_path)
