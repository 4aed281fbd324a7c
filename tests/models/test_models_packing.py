"""Packing tree: trains from the measured catalog, explains its path, survives a JSON round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lucid_core.domain import Profile, ShareClass, SharingKey
from lucid_core.models.datasets import shared_data_dir
from lucid_core.models.packing import (
    FEATURES,
    PackingTree,
    catalog_key,
    default_tree_path,
    load_packing_catalog,
    pair_quality,
    speed_labels,
)
from lucid_core.policy.predictors import PackingClassifier

CATALOG = shared_data_dir() / "lucid_artifact"


@pytest.fixture(scope="module")
def catalog():
    if not (CATALOG / "single_data.csv").exists():
        pytest.skip(f"reference catalog not found at {CATALOG} (set LUCID_SHARED_DATA)")
    return load_packing_catalog(CATALOG)


@pytest.fixture(scope="module")
def tree(catalog):
    return PackingTree().fit_catalog(catalog)


def test_speed_labels_follow_thresholds():
    labels = speed_labels(np.array([0.99, 0.95, 0.94, 0.85, 0.84, np.nan]), 0.95, 0.85)
    assert labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert speed_labels(np.array([0.9]), tiny_threshold=0.88, medium_threshold=0.8).tolist() == [0]


def test_tree_beats_majority_class_and_is_a_packing_classifier(catalog, tree):
    y = tree.catalog_labels(catalog)
    majority = np.bincount(y).max() / len(y)
    assert tree.cv_accuracy_ > majority + 0.1
    in_sample = (tree.predict(catalog.profiles[list(FEATURES)]) == y).mean()
    assert in_sample >= 0.8
    assert isinstance(tree, PackingClassifier)
    assert max(tree.feature_importances_, key=tree.feature_importances_.get) == "gpu_util"


def test_classify_agrees_with_predict_and_explain_names_the_class(catalog, tree):
    rows = catalog.profiles.head(12)
    profiles = [Profile(r.gpu_util, r.mem_util, r.gpu_mem_mb, bool(r.amp)) for r in rows.itertuples()]
    assert [int(c) for c in tree.classify(profiles)] == tree.predict(rows[list(FEATURES)]).tolist()
    busy = Profile(gpu_util=99.0, mem_util=80.0, gpu_mem_mb=20000.0)
    assert tree.classify([busy]) == [ShareClass.JUMBO]
    text = tree.explain(busy)
    assert "UG=99" in text and "Jumbo" in text


def test_json_round_trip_predicts_identically(tmp_path, catalog, tree):
    path = tree.save_json(tmp_path / "tree.json")
    loaded = PackingTree.load_json(path)
    X = catalog.profiles[list(FEATURES)]
    assert loaded.predict(X).tolist() == tree.predict(X).tolist()
    assert json.loads(path.read_text())["kind"] == "lucid.packing_tree"


def test_pair_quality_counts_allowed_and_good_pairs(catalog):
    jumbo_all = pair_quality(catalog, [2] * len(catalog.profiles))
    assert jumbo_all.allowed == 0 and jumbo_all.good > 0
    tiny_all = pair_quality(catalog, [0] * len(catalog.profiles))
    mem = dict(zip(catalog.profiles["key"], catalog.profiles["gpu_mem_mb"], strict=True))
    fits = sum(mem[a] + mem[b] <= 24576.0 for a, b in zip(catalog.pairs["key1"], catalog.pairs["key2"], strict=True))
    assert tiny_all.allowed == fits  # every score sum is 0: only the memory rule refuses
    assert 0.0 < tiny_all.precision < 1.0


def test_shipped_default_tree_loads_and_classifies():
    path = default_tree_path()
    if not path.exists():
        pytest.skip(f"{path} not generated yet")
    tree = PackingTree.load_json(path)
    assert tree.classify([Profile(5.0, 1.0, 2000.0)]) == [ShareClass.TINY]
    assert tree.classify([Profile(100.0, 85.0, 13000.0)]) == [ShareClass.JUMBO]


def test_a_four_configuration_calibration_still_trains():
    """A short calibration run measures only a few workloads: folds shrink instead of failing."""
    import warnings

    import pandas as pd

    from lucid_core.models.packing import PackingTree

    X = pd.DataFrame({"gpu_util": [20.0, 30.0, 90.0, 95.0], "mem_util": [5.0, 8.0, 40.0, 50.0],
                      "gpu_mem_mb": [1500.0, 2000.0, 9000.0, 12000.0], "amp": [0, 0, 0, 1]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = PackingTree().fit(X, [0, 0, 2, 2])
    assert tree.classify([Profile(25, 6, 1800), Profile(92, 45, 10000)]) == [0, 2]
    single = PackingTree().fit(X.iloc[:1], [0])
    assert single.classify([Profile(25, 6, 1800)]) == [0] and single.cv_accuracy_ != single.cv_accuracy_


def test_the_artifact_catalog_is_recognized_by_its_content_not_its_folder_name(tmp_path):
    """A renamed copy of the artifact (rows reordered, CRLF line endings, a BOM) still says RTX 3090 time slicing;
    the embedded sample in a folder named `lucid_artifact` is not taken for it and must declare its GPU."""
    import shutil

    from lucid_core.models.packing import ARTIFACT_KEY, catalog_key

    if not (CATALOG / "single_data.csv").exists():
        pytest.skip(f"reference catalog not found at {CATALOG} (set LUCID_SHARED_DATA)")
    copy = tmp_path / "my-copy"
    copy.mkdir()
    header, *rows = (CATALOG / "single_data.csv").read_text().splitlines()
    text = "\r\n".join([header, *reversed(rows[1:]), "  ", rows[0]]) + "\r\n"  # CRLF, a blank line, reordered
    (copy / "single_data.csv").write_bytes(b"\xef\xbb\xbf" + text.encode())  # as a spreadsheet saves it (BOM)
    shutil.copy(CATALOG / "colocate_info.csv", copy / "colocate_info.csv")
    assert catalog_key(copy) == ARTIFACT_KEY

    impostor = tmp_path / "lucid_artifact"
    shutil.copytree(Path(__file__).resolve().parents[2] / "include" / "sample", impostor)
    with pytest.raises(ValueError, match="declare --gpu-model and --sharing"):
        catalog_key(impostor)
    assert catalog_key(impostor, "NVIDIA H200", "mps").gpu_model == "NVIDIA H200"

    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "single_data.csv").write_text("\n".join([header, *rows[1:]]) + "\n")  # one measured row missing
    with pytest.raises(ValueError, match="declare"):
        catalog_key(edited)


def _artifact_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "catalog"
    folder.mkdir()
    for name in ("single_data.csv", "colocate_info.csv"):
        (folder / name).write_bytes((shared_data_dir() / "lucid_artifact" / name).read_bytes())
    return folder


@pytest.mark.parametrize("speed", [1e9, -5.0, 1.6, 0.0, float("inf")])
def test_a_pair_speed_no_measurement_can_give_is_refused_naming_its_row(tmp_path, speed):
    """Averaged in, one pair at 1e9 lifted its configuration's mean speed past the Tiny threshold: a
    hand-made or damaged catalog made an unsafe pair look safe to the packing tree."""
    import pandas as pd

    folder = _artifact_copy(tmp_path)
    pairs = pd.read_csv(folder / "colocate_info.csv", index_col=0)
    pairs.iloc[2, pairs.columns.get_loc("speed1")] = speed
    pairs.to_csv(folder / "colocate_info.csv")
    text = (folder / "colocate_info.csv").read_text().splitlines()
    (folder / "colocate_info.csv").write_text("\n".join([text[0], "", *text[1:]]) + "\n")  # a blank line, skipped
    with pytest.raises(ValueError, match=r"colocate_info.csv: line 5: co-located speeds .* between 0.01 and 1.5"):
        load_packing_catalog(folder)


def test_a_pair_speed_that_is_no_number_is_left_out_as_not_measured(tmp_path):
    import pandas as pd

    folder = _artifact_copy(tmp_path)
    pairs = pd.read_csv(folder / "colocate_info.csv", index_col=0)
    whole = load_packing_catalog(folder)
    pairs.iloc[0, pairs.columns.get_loc("speed2")] = float("nan")
    pairs.to_csv(folder / "colocate_info.csv")
    loaded = load_packing_catalog(folder)
    assert len(loaded.pairs) == len(whole.pairs) - 1 == len(pairs) - 1
    assert loaded.pairs["speed1"].notna().all() and loaded.pairs["speed2"].notna().all()


def test_a_declared_key_that_contradicts_the_recorded_one_is_refused(tmp_path):
    """MPS measurements declared as time-sliced (or one GPU model's as another's) would label pairs safe on
    GPUs shared in a way nobody measured; a declaration that only fills in what the catalog left out stands."""
    folder = _artifact_copy(tmp_path)
    (folder / "environment.json").write_text(json.dumps({"gpu_model": "NVIDIA H200", "sharing": "mps"}))
    assert catalog_key(folder) == catalog_key(folder, "NVIDIA H200", "mps") == SharingKey("NVIDIA H200", "mps")
    with pytest.raises(ValueError, match=r"measured with sharing 'mps' .*not 'time-slice'"):
        catalog_key(folder, sharing="time-slice")
    with pytest.raises(ValueError, match=r"measured with gpu-model 'NVIDIA H200' .*not 'NVIDIA A100'"):
        catalog_key(folder, gpu_model="NVIDIA A100")
    assert catalog_key(folder, " nvidia  h200", "mps") == SharingKey("NVIDIA H200", "mps")  # the same key
    (folder / "environment.json").write_text(json.dumps({"gpus": ["NVIDIA H200"]}))
    assert catalog_key(folder, sharing="time-slice") == SharingKey("NVIDIA H200", "time-slice")
    (folder / "environment.json").unlink()  # the artifact itself, known by its content: RTX 3090, time slicing
    with pytest.raises(ValueError, match="measured with sharing 'time-slice' \\(the Lucid artifact's\\)"):
        catalog_key(folder, "NVIDIA GeForce RTX 3090", "mps")
