"""The simulator labels jobs with the tree trained from the catalog it runs on, never a fixed rule."""

from __future__ import annotations

import pytest

from lucid_core.config import LucidConfig
from lucid_core.domain import Profile, ShareClass
from lucid_core.models.datasets import shared_data_dir
from lucid_core.policy.lucid import LucidPolicy
from lucid_core.sim.catalog import WorkloadCatalog
from lucid_core.sim.engine import simulate
from lucid_core.sim.experiment import Experiment, build_policy
from lucid_core.sim.records import TraceRecord


def _profile(w) -> Profile:
    return Profile(w.gpu_util, w.mem_util, w.gpu_mem_mb, w.amp, emulated=True)


H200 = shared_data_dir() / "gpu_calibration_h200"


def _catalog(folder: str) -> WorkloadCatalog:
    path = H200 / folder / "catalog"
    if not (path / "single_data.csv").exists():
        pytest.skip(f"H200 calibration catalog not found at {path}")
    return WorkloadCatalog.from_artifact(path)


def _crowd(n: int = 40) -> list[TraceRecord]:
    """One-GPU jobs arriving faster than two 1-GPU nodes run them: sharing is what would shorten them."""
    return [TraceRecord(f"j{i}", i * 60.0, 3600.0, 1, user=f"u{i % 3}") for i in range(n)]


def _shared_jobs(catalog: WorkloadCatalog) -> int:
    config = LucidConfig().with_overrides({"cluster.gpus_per_node": 1, "binder.sharing": "on"})
    exp = Experiment(_crowd(), [], catalog, config, 2, 0, None)
    policy, config = build_policy("lucid", exp)
    assert isinstance(policy, LucidPolicy)
    result = simulate(exp.records, policy, config, main_nodes=2, workloads=catalog.assign(exp.records),
                      speeds=catalog.colocated_speeds, check_invariants=True)
    return sum(1 for o in result.outcomes if o.shared_seconds > 0)


def test_the_time_sliced_h200_catalog_shares_no_job_where_the_old_rule_would():
    catalog = _catalog("time_sliced")
    tree = catalog.packing_tree()
    assert set(tree.classify([_profile(w) for w in catalog.workloads])) == {ShareClass.JUMBO}
    assert _shared_jobs(catalog) == 0


def test_the_mps_h200_catalog_pairs_the_jobs_its_tree_allows():
    catalog = _catalog("mps")
    assert "fit without cross-validation" in catalog.packing_tree().fit_note_
    assert _shared_jobs(catalog) > 0


def test_a_synthetic_catalog_is_labelled_by_a_tree_trained_on_its_own_pairs():
    catalog = WorkloadCatalog.synthetic()
    tree = catalog.packing_tree()
    assert tree is catalog.packing_tree()  # trained once per catalog
    predicted = tree.classify([_profile(w) for w in catalog.workloads])
    measured = [ShareClass(w.label) for w in catalog.workloads]
    agree = sum(p == m for p, m in zip(predicted, measured, strict=True)) / len(measured)
    assert agree >= 0.75
