"""Job-name buckets, the synthetic log generator and the model registry."""

from __future__ import annotations

import time

import numpy as np
import pytest

from lucid_core.models.names import NO_NAME, JobNameBucketer, normalize_name
from lucid_core.models.registry import ModelRegistry, code_version
from lucid_core.models.synthetic import synthetic_job_log
from lucid_core.sim.records import records_from_frame


def test_normalize_name_merges_runs_of_one_sweep():
    assert normalize_name("ResNet50_lr0.01_run3") == normalize_name("resnet50-lr0.02-run12")
    assert normalize_name("bert_base") != normalize_name("gpt2_small")


def test_buckets_group_similar_names_and_keep_families_apart():
    families = ("imagenet-resnet50-baseline", "squad-bert-large-finetune", "atari-ppo-pong-rollout", "coco-yolo")
    names = [f"{fam}_{kind}_lr{lr}" for fam in families for kind in ("debug", "sweep", "final") for lr in (1, 3)]
    bucketer = JobNameBucketer().fit(names)
    ids = dict(zip(names, bucketer.transform(names), strict=True))
    assert ids["imagenet-resnet50-baseline_sweep_lr1"] == ids["imagenet-resnet50-baseline_sweep_lr3"]
    assert len(set(ids.values())) < len({normalize_name(n) for n in names})  # similar forms merged
    for fam in families:  # every bucket holds one family only
        others = [ids[n] for n in names if not n.startswith(fam)]
        assert not {ids[n] for n in names if n.startswith(fam)} & set(others)
    new = bucketer.transform(["", "imagenet-resnet50-baselines_final2_lr30"])
    assert new[0] == NO_NAME and bucketer.bucket_name(int(new[1])).startswith("imagenet_resnet#")


def test_ten_thousand_distinct_names_bucket_in_under_a_minute():
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    names = {"".join(rng.choice(letters, size=int(rng.integers(6, 20)))) for _ in range(10_500)}
    names = sorted(names)[:10_000]
    assert len({normalize_name(n) for n in names}) == 10_000  # really distinct after normalization
    started = time.perf_counter()
    ids = JobNameBucketer().fit(names).transform(names)
    assert time.perf_counter() - started < 60.0
    assert 1 < len(set(ids)) < 10_000 and (ids >= 0).all()


def test_synthetic_log_recurs_and_is_deterministic():
    a = synthetic_job_log(1500, seed=7)
    b = synthetic_job_log(1500, seed=7)
    assert a.equals(b)
    assert a["submit_time"].is_monotonic_increasing
    assert set(a["kind"]) == {"debug", "sweep", "final"}
    by_kind = a.groupby("kind")["duration"].median()
    assert by_kind["debug"] < by_kind["sweep"] < by_kind["final"]
    assert a.groupby("user").size().max() >= 20  # users come back
    records = records_from_frame(a.head(3))
    assert records[0].job_id == a.iloc[0]["job_id"] and records[0].name == a.iloc[0]["name"]


def test_registry_versions_promote_load_compare(tmp_path):
    registry = ModelRegistry(tmp_path)
    v1 = registry.register("throughput", {"w": 1}, kind="dummy", training_window=("2020-04-01", "2020-07-31"),
                           data_hash="abc", metrics={"mae": 2.5})
    v2 = registry.register("throughput", {"w": 2}, kind="dummy", training_window=("2020-04-01", "2020-08-31"),
                           data_hash="def", metrics={"mae": 2.3, "naive_mae": 2.6})
    assert (v1.version, v2.version) == (1, 2)
    with pytest.raises(LookupError):
        registry.load("throughput")
    registry.promote("throughput", 1)
    assert registry.load("throughput") == {"w": 1}
    registry.promote("throughput", 2)
    assert registry.load("throughput") == {"w": 2} and registry.load("throughput", 1) == {"w": 1}
    listed = registry.list()
    assert [m.version for m in listed] == [1, 2] and [m.promoted for m in listed] == [False, True]
    assert listed[1].code_version == code_version() and listed[1].data_hash == "def"
    assert registry.compare("throughput", 1, 2) == {"mae": (2.5, 2.3), "naive_mae": (None, 2.6)}
    with pytest.raises(KeyError):
        registry.promote("throughput", 9)
