"""`lucid models ...` end to end on small inputs: train, register, promote, eval, list, compare."""

from __future__ import annotations

import argparse
import json

import pytest

from lucid_core.models.cli import add_parser
from lucid_core.models.datasets import shared_data_dir
from lucid_core.models.synthetic import synthetic_job_log


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lucid")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_train_duration_register_eval_compare(tmp_path, capsys):
    log = tmp_path / "jobs.csv"
    synthetic_job_log(1500, n_users=12, days=10, seed=5).drop(columns=["submit_time"]).to_csv(log, index=False)
    reg = str(tmp_path / "reg")
    common = ["models", "train-duration", "--trace", str(log), "--test-start", "2024-01-08", "--test-end",
              "2024-01-11", "--rounds", "100", "--bags", "1", "--registry", reg]
    assert run([*common, "--promote"]) == 0
    out = capsys.readouterr().out
    assert "| EBM |" in out and "| history fallback alone |" in out and "registered duration v1" in out
    assert run([*common, "--monotone-gpus"]) == 0
    capsys.readouterr()
    assert run(["models", "list", "--registry", reg]) == 0
    listing = capsys.readouterr().out
    assert "| duration | 1 | yes |" in listing and "| duration | 2 |" in listing
    assert run(["models", "compare", "duration", "1", "2", "--registry", reg]) == 0
    assert "| r2 |" in capsys.readouterr().out
    assert run(["models", "eval", "duration", "--registry", reg, "--data", str(log), "--from", "2024-01-08"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["jobs"] > 0 and scores["r2"] > scores["fallback_r2"]


def test_train_packing_writes_readable_tree(tmp_path, capsys):
    catalog = shared_data_dir() / "lucid_artifact"
    if not (catalog / "single_data.csv").exists():
        pytest.skip(f"reference catalog not found at {catalog}")
    out = tmp_path / "tree.json"
    assert run(["models", "train-packing", "--catalog", str(catalog), "--out", str(out), "--no-register"]) == 0
    assert "CV accuracy" in capsys.readouterr().out
    assert json.loads(out.read_text())["nodes"][0]["feature"] == "gpu_util"


def test_train_and_eval_throughput(tmp_path, capsys):
    series = shared_data_dir() / "venus" / "cluster_throughput_2020-04_2020-08.csv"
    if not series.exists():
        pytest.skip(f"Venus series not found at {series}")
    import pandas as pd

    part = tmp_path / "series.csv"
    frame = pd.read_csv(series, parse_dates=["time"])
    frame[(frame["time"] >= "2020-06-01") & (frame["time"] < "2020-07-08")].to_csv(part, index=False)
    reg = str(tmp_path / "reg")
    assert run(["models", "train-throughput", "--series", str(part), "--validate-from", "2020-07-01",
                "--rounds", "100", "--bags", "1", "--interactions", "2", "--registry", reg, "--promote"]) == 0
    out = capsys.readouterr().out
    assert "| submit_gpu_job |" in out and "| submit_gpu_num |" in out and "registered submit_gpu_num v1" in out
    assert run(["models", "eval", "throughput", "--registry", reg, "--data", str(part), "--from", "2020-07-01"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["target"] == "submit_gpu_job" and scores["mae"] < scores["naive_mae"]


H200 = shared_data_dir() / "gpu_calibration_h200"


@pytest.mark.parametrize(("folder", "sharing", "labels"), [("mps", "mps", {"Tiny", "Medium"}),
                                                           ("time_sliced", "time-slice", {"Jumbo"})])
def test_train_packing_on_the_small_h200_catalogs_promotes_per_key_into_the_store(
        tmp_path, capsys, monkeypatch, folder, sharing, labels):
    catalog = H200 / folder / "catalog"
    if not (catalog / "single_data.csv").exists():
        pytest.skip(f"H200 calibration catalog not found at {catalog}")
    from lucid_core.runtime.round.snapshot import load_snapshot
    from lucid_core.runtime.store.store import open_store

    # the kit's older catalogs name the GPU but not the mechanism: training without it is refused, clearly
    assert run(["models", "train-packing", "--catalog", str(catalog), "--no-register"]) == 2
    assert "declare --sharing" in capsys.readouterr().err
    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    # a round loads only artifacts under LUCID_HOME/models: promoting from a registry elsewhere is refused early
    assert run(["models", "train-packing", "--catalog", str(catalog), "--sharing", sharing, "--registry",
                str(tmp_path / "reg"), "--promote", "--store", url]) == 2
    assert "lies outside it" in capsys.readouterr().err and not (tmp_path / "reg").exists()
    assert run(["models", "train-packing", "--catalog", str(catalog), "--sharing", sharing, "--promote",
                "--store", url]) == 0
    out = capsys.readouterr().out
    assert f"in {tmp_path / 'home' / 'models' / 'registry'} (promoted)" in out
    kind = f"packing:nvidia-h200:{sharing}"
    assert f"key: NVIDIA H200 shared by {sharing} (model kind {kind})" in out
    assert {word for word in labels if f"class: {word}" in out} == labels
    if folder == "mps":  # two configurations: nothing to cross-validate, and it says so
        assert "fit without cross-validation: 2 configuration(s)" in out and "CV accuracy" not in out
    store = open_store(url)
    try:
        models = load_snapshot(store, 0.0).models
    finally:
        store.dispose()
    assert list(models) == [kind]
    from lucid_core.runtime.round.live_models import load_model

    tree = load_model(models[kind][1], needs=("classify",), root=tmp_path / "home" / "models")
    assert tree is not None and tree.nodes_
