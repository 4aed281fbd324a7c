"""The simulator labels jobs with the tree trained from the catalog it runs on, never a fixed rule."""

from __future__ import annotations

import os

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
ARTIFACT = shared_data_dir() / "lucid_artifact"


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


def test_a_fleet_of_two_gpu_models_runs_each_by_its_own_catalog_and_tree():
    """H200s shared by time slicing (no safe pair measured) beside H200s under MPS: pairs form only on the MPS
    hosts, and a pair there runs at the MPS catalog's speeds."""
    from lucid_core.domain import SharingKey
    from lucid_core.sim.fleet import Fleet, FleetCatalogs, FleetHost, simulate_on_fleet

    sliced, mps = _catalog("time_sliced"), _catalog("mps")
    fleet = Fleet((FleetHost("prof", 1, pool="profiling", gpu_model="NVIDIA H200", sharing="mps"),
                   FleetHost("ts0", 1, gpu_model="NVIDIA H200", sharing="time-slice"),
                   FleetHost("ts1", 1, gpu_model="NVIDIA H200", sharing="time-slice"),
                   FleetHost("mps0", 1, gpu_model="NVIDIA H200", sharing="mps")))
    catalogs = FleetCatalogs({SharingKey("NVIDIA H200", "time-slice"): sliced,
                              SharingKey("NVIDIA H200", "mps"): mps}, default=sliced)
    config = fleet.config_for(LucidConfig().with_overrides({"binder.sharing": "on"}))
    records = _crowd(30)
    policy = LucidPolicy(config, packing_models=catalogs.packing_models())
    result = simulate_on_fleet(records, policy, config, fleet, catalogs=catalogs, keep_log=True)
    pair_reasons = [why for _, kind, _, why in result.decision_log if kind == "Place" and "shares with" in why]
    assert len(result.outcomes) == 30
    assert pair_reasons and all("on NVIDIA H200 shared by mps" in why for why in pair_reasons)
    shared = len([o for o in result.outcomes if o.shared_seconds > 0])
    assert len(pair_reasons) < shared <= 2 * len(pair_reasons)  # a running job may take partners in turn
    # the same crowd with every host time-sliced: no pair at all
    only_sliced = Fleet(tuple(FleetHost(h.name, h.gpus, h.pool, gpu_model="NVIDIA H200", sharing="time-slice")
                              for h in fleet.hosts))
    policy = LucidPolicy(config, packing_models=catalogs.packing_models())
    again = simulate_on_fleet(records, policy, config, only_sliced, catalogs=catalogs)
    assert not [o for o in again.outcomes if o.shared_seconds > 0]


def test_the_tuner_replays_a_mixed_fleet_with_a_catalog_per_gpu_model():
    from lucid_core.domain import SharingKey
    from lucid_core.sim.fleet import Fleet, FleetCatalogs, FleetHost
    from lucid_core.tuner import TunerSettings, run_configuration

    sliced, mps = _catalog("time_sliced"), _catalog("mps")
    fleet = Fleet((FleetHost("prof", 1, pool="profiling", gpu_model="NVIDIA H200", sharing="mps"),
                   FleetHost("ts0", 1, gpu_model="NVIDIA H200"), FleetHost("mps0", 1, gpu_model="NVIDIA H200",
                                                                            sharing="mps")))
    catalogs = FleetCatalogs({SharingKey("NVIDIA H200", "time-slice"): sliced,
                              SharingKey("NVIDIA H200", "mps"): mps}, default=sliced)
    result = run_configuration(_crowd(20), {"binder.sharing": "on"}, TunerSettings(fleet=fleet), catalogs=catalogs)
    assert result.error is None and result.metrics["jobs_shared"] > 0  # on the MPS host
    single = run_configuration(_crowd(20), {"binder.sharing": "on"}, TunerSettings(fleet=fleet), catalog=sliced)
    assert single.error is None and single.metrics["jobs_shared"] == 0  # the time-sliced catalog on every host


def test_catalog_for_items_name_their_key_or_take_it_from_the_catalog(tmp_path):
    from lucid_core.domain import SharingKey
    from lucid_core.tuner import fleet_catalogs

    folder = H200 / "mps" / "catalog"
    if not (folder / "single_data.csv").exists():
        pytest.skip(f"H200 calibration catalog not found at {folder}")
    named = fleet_catalogs([f"NVIDIA H200:mps={folder}"], None)
    assert list(named.by_key) == [SharingKey("NVIDIA H200", "mps")]
    with pytest.raises(ValueError, match="declare --sharing"):  # the kit's older record names no mechanism
        fleet_catalogs([str(folder)], None)
    artifact = H200.parent / "lucid_artifact"  # measured on RTX 3090s by time slicing: no evidence for an H200
    with pytest.raises(ValueError, match=r"measured with gpu-model 'NVIDIA GeForce RTX 3090' \(the Lucid artifact's\)"):
        fleet_catalogs([f"NVIDIA H200:mps={artifact}"], None)


def test_the_fitted_tree_is_kept_between_runs_and_read_back_identical(tmp_path, monkeypatch):
    """A second catalog of the same data reads the tree the first one fitted (no refit, same labels); a
    changed catalog fits anew."""
    from lucid_core.domain import Profile
    from lucid_core.models import packing
    from lucid_core.sim.catalog import WorkloadCatalog

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = WorkloadCatalog.synthetic()
    fitted = first.packing_tree()
    path = first.packing_tree_cache_path()
    assert path.is_file() and path.is_relative_to(tmp_path / "cache" / "lucid" / "packing-trees")
    calls = []
    monkeypatch.setattr(packing.PackingTree, "fit_catalog", lambda self, c: calls.append(c) or fitted)
    again = WorkloadCatalog.synthetic().packing_tree()
    assert calls == [] and again.nodes_ == fitted.nodes_ and again.ccp_alpha_ == fitted.ccp_alpha_
    profiles = [Profile(w.gpu_util, w.mem_util, w.gpu_mem_mb, w.amp) for w in first.workloads]
    assert again.classify(profiles) == fitted.classify(profiles)
    path.write_text("{not json")  # a damaged file is fitted again, never believed
    WorkloadCatalog.synthetic().packing_tree()
    assert len(calls) == 1


def test_a_folder_catalogs_kept_tree_is_read_without_pandas_and_a_changed_file_fits_anew(tmp_path):
    """A run that finds its tree kept imports neither pandas nor scikit-learn (the simulator's start pays for
    neither); one changed measurement in the folder is another catalog, fitted anew."""
    import shutil
    import subprocess
    import sys

    if not (ARTIFACT / "single_data.csv").exists():
        pytest.skip(f"the Lucid artifact's catalog not found at {ARTIFACT}")
    folder = tmp_path / "catalog"
    shutil.copytree(ARTIFACT, folder)
    script = ("import sys; from lucid_core.sim.catalog import WorkloadCatalog; "
              f"c = WorkloadCatalog.from_artifact({str(folder)!r}); t = c.packing_tree(); "
              "print(c.packing_tree_cache_path().name, len(t.nodes_), "
              "'pandas' in sys.modules, 'sklearn' in sys.modules)")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def run() -> list[str]:
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    fitted = run()
    assert fitted[2:] == ["True", "True"]  # nothing kept yet: read with pandas, fitted with scikit-learn
    kept = run()
    assert kept[:2] == fitted[:2] and kept[2:] == ["False", "False"]
    pairs = folder / "colocate_info.csv"
    lines = pairs.read_text().splitlines()
    cells = lines[1].split(",")
    header = lines[0].split(",")
    speed = header.index("speed1")
    cells[speed] = f"{float(cells[speed]) * 0.9:.6f}"
    pairs.write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    changed = run()
    assert changed[0] != fitted[0] and changed[2:] == ["True", "True"]


def test_a_tree_fitted_while_its_catalog_changed_is_not_kept_under_the_old_files_key(tmp_path, monkeypatch):
    """The kept tree's key is read from the files before the fit reads them again: when a file changes in between,
    the tree (fitted on the new content) is used for this run but not kept under the old content's key."""
    import shutil

    from lucid_core.models import packing

    if not (ARTIFACT / "single_data.csv").exists():
        pytest.skip(f"the Lucid artifact's catalog not found at {ARTIFACT}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "catalog"
    shutil.copytree(ARTIFACT, folder)
    pairs = folder / "colocate_info.csv"
    original = pairs.read_text()
    load = packing.load_packing_catalog

    def changed_while_read(directory):
        lines = original.splitlines()
        speed = lines[0].split(",").index("speed1")
        rows = [line.split(",") for line in lines[1:]]
        for row in rows:
            row[speed] = f"{float(row[speed]) * 0.5:.4f}"
        pairs.write_text("\n".join([lines[0], *(",".join(r) for r in rows)]) + "\n")
        return load(directory)

    catalog = WorkloadCatalog.from_artifact(folder)
    key = catalog.packing_tree_cache_path()
    monkeypatch.setattr(packing, "load_packing_catalog", changed_while_read)
    catalog.packing_tree()
    assert not key.exists()  # not kept under the key of the bytes it was not fitted on
