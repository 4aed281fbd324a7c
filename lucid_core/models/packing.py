"""Packing Analyze Model: a pruned decision tree that labels a profile Tiny / Medium / Jumbo.

Labels come from measured co-location: a configuration whose mean normalized speed next to
other jobs is >= the Tiny threshold is Tiny, >= the Medium threshold Medium, else Jumbo.
The fitted tree is kept as a plain node list so it can be saved as readable JSON, evaluated
without scikit-learn, and explained split by split.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # scikit-learn and pandas are imported where a tree is fitted or a catalog read: a saved tree is
    # read and applied without them (the simulator's start pays for neither)
    import pandas as pd
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.tree import DecisionTreeClassifier

from lucid_core.domain import SHARING_MECHANISMS, Profile, ShareClass, SharingKey, pair_speed_problem

FEATURES = ("gpu_util", "mem_util", "gpu_mem_mb", "amp")
FEATURE_LABELS = {"gpu_util": "UG", "mem_util": "UM", "gpu_mem_mb": "MG", "amp": "AMP"}
CONFIG_KEY = ("model", "dataset", "batchsize", "amp")


@dataclass(frozen=True)
class PackingCatalog:
    """Measured exclusive profiles (one row per configuration) and co-located pairs."""

    profiles: pd.DataFrame  # key, FEATURES, mean_speed (NaN if never co-located), catalog_label
    pairs: pd.DataFrame  # key1, key2, speed1, speed2


def _config_keys(frame: pd.DataFrame, suffix: str = "") -> pd.Series:
    parts = [frame[f"{c}{suffix}"].astype(str) for c in CONFIG_KEY]
    return parts[0].str.cat(parts[1:], sep="/")


def load_packing_catalog(directory: str | Path) -> PackingCatalog:
    """Read single_data.csv + colocate_info.csv (the Lucid artifact's measured catalog format). A pair whose
    speeds are no measurement of sharing is refused (`domain.pair_speed_problem`): averaged in, one huge speed
    would label its configuration Tiny and make an unsafe pair look safe. A speed that is not a number is left
    out, as not measured."""
    import pandas as pd

    directory = Path(directory)
    single = pd.read_csv(directory / "single_data.csv")
    pairs_raw = pd.read_csv(directory / "colocate_info.csv", index_col=0)
    pairs = pd.DataFrame({
        "key1": _config_keys(pairs_raw, "1"), "key2": _config_keys(pairs_raw, "2"),
        "speed1": pairs_raw["speed1"].astype(float), "speed2": pairs_raw["speed2"].astype(float),
    })
    _check_pair_speeds(pairs, directory / "colocate_info.csv")
    pairs = pairs[np.isfinite(pairs["speed1"]) & np.isfinite(pairs["speed2"])].reset_index(drop=True)
    speeds = pd.concat([pairs[["key1", "speed1"]].set_axis(["key", "speed"], axis=1),
                        pairs[["key2", "speed2"]].set_axis(["key", "speed"], axis=1)])
    mean_speed = speeds.groupby("key")["speed"].mean()
    keys = _config_keys(single)
    profiles = pd.DataFrame({
        "key": keys,
        "gpu_util": single["gpu_util"].astype(float),
        "mem_util": single["gmem_util"].astype(float),
        "gpu_mem_mb": single["gmem"].astype(float),
        "amp": single["amp"].astype(int),
        "mean_speed": keys.map(mean_speed).astype(float),
        "catalog_label": single["label"].astype(int) if "label" in single else np.nan,
    })
    unknown = set(pairs["key1"]).union(pairs["key2"]) - set(keys)
    if unknown:
        raise ValueError(f"colocate_info.csv names configurations missing from single_data.csv: {sorted(unknown)[:5]}")
    return PackingCatalog(profiles=profiles, pairs=pairs)


def _same_name(text: str) -> str:
    """A GPU model or mechanism as keys compare it (`SharingKey`'s slug: case and spacing aside)."""
    return SharingKey(text, "none").slug


def _check_pair_speeds(pairs: pd.DataFrame, path: Path) -> None:
    """Refuse the first pair row whose speeds cannot be a measurement of sharing, naming its line in the file (as
    the simulator's reader does)."""
    for row, (s1, s2) in enumerate(zip(pairs["speed1"], pairs["speed2"], strict=True)):
        problem = pair_speed_problem(float(s1), float(s2))
        if problem is not None:
            raise ValueError(f"{path}: line {_data_lines(path)[row]}: {problem}")


def _data_lines(path: Path) -> list[int]:
    """The file line of each data row of a CSV, as pandas counts rows (empty lines skipped)."""
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        next(reader, None)
        return [reader.line_num for row in reader if row]


#: the Lucid artifact's catalog (no environment.json): measured on RTX 3090s sharing by the GPU's time slicing
ARTIFACT_KEY = SharingKey("NVIDIA GeForce RTX 3090", "time-slice")
#: the artifact's single_data.csv, recognized by what it holds (its 66 measured rows, in any order and with any
#: line endings), not by its folder's name: a user's own catalog in a folder of that name is not taken for it
ARTIFACT_SINGLE_SHA256 = "8b84f27e7ba338d4ca12b83425eab11d0bf499640213aade1a56e7b31655e2da"


def catalog_key(directory: str | Path, gpu_model: str | None = None, sharing: str | None = None) -> SharingKey:
    """The (GPU model, sharing mechanism) a catalog was measured on: its environment.json (`gpu_model`, else
    the first of `gpus`; `sharing`), or what the caller declares where it says nothing. A catalog that names
    neither needs both declared: labels without a key would be applied to GPUs they say nothing of. A
    declaration that contradicts what the catalog recorded is refused: MPS measurements applied to
    time-sliced GPUs, or one model's to another's, would call pairs safe that were never measured so."""
    from lucid_core.calibration.catalog import catalog_sharing_key

    found_model, found_sharing = catalog_sharing_key(directory)
    found_sharing = found_sharing if found_sharing in SHARING_MECHANISMS else None
    source = "its environment.json"
    if not (found_model or found_sharing) and is_artifact_catalog(Path(directory)):
        found_model, found_sharing, source = ARTIFACT_KEY.gpu_model, ARTIFACT_KEY.mechanism, "the Lucid artifact's"
    for flag, declared, recorded in (("--gpu-model", gpu_model, found_model), ("--sharing", sharing, found_sharing)):
        if declared and recorded and _same_name(declared) != _same_name(recorded):
            raise ValueError(f"{directory}: measured with {flag.removeprefix('--')} {recorded!r} ({source}), not "
                             f"{declared!r}: its labels hold only for what it was measured on; leave {flag} out, "
                             f"or calibrate on {declared!r}")
    model, mechanism = gpu_model or found_model, sharing or found_sharing
    missing = [(flag, what) for flag, what, value in (("--gpu-model", "the GPU model", model),
                                                     ("--sharing", "the sharing mechanism", mechanism)) if not value]
    if missing:
        raise ValueError(f"{directory}: its environment.json does not say {' or '.join(w for _, w in missing)} it "
                         f"was measured with; declare {' and '.join(f for f, _ in missing)}")
    return SharingKey(str(model), str(mechanism))


def single_rows_digest(path: Path) -> str:
    """SHA-256 of a single_data.csv's header and rows, cells stripped, blank lines dropped and rows sorted (order,
    line endings and a byte-order mark do not change it)."""
    with path.open(newline="", encoding="utf-8-sig") as handle:  # a BOM (a spreadsheet's save) is not data
        reader = csv.reader(handle)
        header = tuple(cell.strip() for cell in next(reader, []))
        rows = sorted(tuple(cell.strip() for cell in row) for row in reader if any(cell.strip() for cell in row))
    return hashlib.sha256(repr((header, rows)).encode()).hexdigest()


def is_artifact_catalog(directory: Path) -> bool:
    """Whether a folder holds the Lucid artifact's own catalog (its 3090 workloads), by its single_data.csv's
    content; an unreadable file is not it."""
    path = directory / "single_data.csv"
    try:
        if not path.is_file() or path.stat().st_size > 1 << 20:  # the artifact's is 3.5 kB: a large file is not it
            return False
        return single_rows_digest(path) == ARTIFACT_SINGLE_SHA256
    except (OSError, UnicodeDecodeError, csv.Error):
        return False


def speed_labels(mean_speed: np.ndarray, tiny_threshold: float = 0.95, medium_threshold: float = 0.85) -> np.ndarray:
    """Sharing score from mean co-located speed; never co-located (NaN) counts as Jumbo."""
    speed = np.asarray(mean_speed, dtype=float)
    labels = np.full(speed.shape, int(ShareClass.JUMBO))
    labels[speed >= medium_threshold] = int(ShareClass.MEDIUM)
    labels[speed >= tiny_threshold] = int(ShareClass.TINY)
    return labels


def profiles_frame(profiles: Sequence[Profile]) -> pd.DataFrame:
    """Model inputs from profiles, in FEATURES order."""
    import pandas as pd

    return pd.DataFrame({"gpu_util": [p.gpu_util for p in profiles], "mem_util": [p.mem_util for p in profiles],
                         "gpu_mem_mb": [p.gpu_mem_mb for p in profiles], "amp": [int(p.amp) for p in profiles]},
                        columns=list(FEATURES))


class PackingTree:
    """Decision tree over (UG, UM, MG, AMP) with cost-complexity pruning chosen by cross-validation."""

    def __init__(self, tiny_threshold: float = 0.95, medium_threshold: float = 0.85, label_source: str = "speeds",
                 cv_folds: int = 5, random_state: int = 0) -> None:
        self.tiny_threshold = tiny_threshold
        self.medium_threshold = medium_threshold
        self.label_source = label_source
        self.cv_folds = cv_folds
        self.random_state = random_state

    # ---- training -------------------------------------------------------------------------
    def catalog_labels(self, catalog: PackingCatalog) -> np.ndarray:
        """Training labels: derived from measured speeds, or the catalog's own label column."""
        if self.label_source == "speeds":
            return speed_labels(catalog.profiles["mean_speed"].to_numpy(), self.tiny_threshold, self.medium_threshold)
        if self.label_source == "catalog":
            return catalog.profiles["catalog_label"].to_numpy(dtype=int)
        raise ValueError(f"label_source must be 'speeds' or 'catalog', got {self.label_source!r}")

    def _folds(self, y: np.ndarray | None = None) -> int:
        """`cv_folds`, fewer for a small catalog (a fresh calibration of a few workloads): no more
        folds than samples, nor than the rarest label has members when that is at least 2."""
        if y is None:
            return self.cv_folds
        counts = np.bincount(y)
        rarest = int(counts[counts > 0].min())
        if (counts > 0).sum() > 1 and rarest < 2:  # a label seen once cannot be split across folds
            return 1
        return min(self.cv_folds, len(y), rarest)

    def _cv(self, y: np.ndarray | None = None) -> StratifiedKFold:
        from sklearn.model_selection import StratifiedKFold

        return StratifiedKFold(self._folds(y), shuffle=True, random_state=self.random_state)

    def _search(self, X: pd.DataFrame, y: np.ndarray) -> GridSearchCV:
        from sklearn.model_selection import GridSearchCV
        from sklearn.tree import DecisionTreeClassifier

        path = DecisionTreeClassifier(random_state=self.random_state).cost_complexity_pruning_path(X, y)
        alphas = np.unique(np.clip(path.ccp_alphas, 0.0, None))
        search = GridSearchCV(DecisionTreeClassifier(random_state=self.random_state), {"ccp_alpha": alphas},
                              cv=self._cv(y), scoring="accuracy")
        return search.fit(X, y)

    def fit(self, X: pd.DataFrame, y: Sequence[int]) -> PackingTree:
        import pandas as pd
        from sklearn.tree import DecisionTreeClassifier

        X = pd.DataFrame(X)[list(FEATURES)].astype(float)
        y = np.asarray(y, dtype=int)
        self.cross_validated_ = self._folds(y) >= 2
        self.fit_note_ = ""
        if not self.cross_validated_:  # too few configurations to cross-validate: an unpruned tree
            counts = np.bincount(y)
            self.fit_note_ = (f"fit without cross-validation: {len(y)} configuration(s), the rarest label has "
                              f"{int(counts[counts > 0].min())}; the tree only restates the measured labels")
            self.ccp_alpha_, self.cv_accuracy_ = 0.0, float("nan")
            self.estimator_ = DecisionTreeClassifier(random_state=self.random_state).fit(X, y)
        else:
            search = self._search(X, y)
            self.ccp_alpha_ = float(search.best_params_["ccp_alpha"])
            self.cv_accuracy_ = float(search.best_score_)
            self.estimator_ = search.best_estimator_
        self.feature_importances_ = dict(zip(FEATURES, map(float, self.estimator_.feature_importances_), strict=True))
        self.nodes_ = _nodes_from_sklearn(self.estimator_)
        return self

    def fit_catalog(self, catalog: PackingCatalog) -> PackingTree:
        return self.fit(catalog.profiles[list(FEATURES)], self.catalog_labels(catalog))

    def nested_cv_accuracy(self, X: pd.DataFrame, y: Sequence[int]) -> float:
        """Accuracy with alpha re-chosen inside every outer fold: an unbiased estimate."""
        import pandas as pd
        from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_val_score
        from sklearn.tree import DecisionTreeClassifier

        X = pd.DataFrame(X)[list(FEATURES)].astype(float)
        y = np.asarray(y, dtype=int)
        if self._folds(y) < 3:  # the inner search needs two folds of each outer training part
            return float("nan")
        path = DecisionTreeClassifier(random_state=self.random_state).cost_complexity_pruning_path(X, y)
        inner = GridSearchCV(DecisionTreeClassifier(random_state=self.random_state),
                             {"ccp_alpha": np.unique(np.clip(path.ccp_alphas, 0.0, None))},
                             cv=StratifiedKFold(max(2, self._folds(y) - 1), shuffle=True,
                                                random_state=self.random_state + 1))
        return float(cross_val_score(inner, X, y, cv=self._cv(y)).mean())

    def out_of_fold_labels(self, X: pd.DataFrame, y: Sequence[int]) -> np.ndarray:
        """Each configuration labelled by a tree that never saw it (chosen alpha, same folds)."""
        import pandas as pd
        from sklearn.model_selection import cross_val_predict
        from sklearn.tree import DecisionTreeClassifier

        X = pd.DataFrame(X)[list(FEATURES)].astype(float)
        est = DecisionTreeClassifier(ccp_alpha=self.ccp_alpha_, random_state=self.random_state)
        y = np.asarray(y, dtype=int)
        if self._folds(y) < 2:  # nothing to hold out: no out-of-fold labels exist
            return np.full(len(y), -1)
        return cross_val_predict(est, X, y, cv=self._cv(y))

    # ---- inference ------------------------------------------------------------------------
    def _leaf(self, row: Sequence[float]) -> tuple[int, list[str]]:
        node, path = 0, []
        while self.nodes_[node]["left"] >= 0:
            n = self.nodes_[node]
            value = row[FEATURES.index(n["feature"])]
            go_left = value <= n["threshold"]
            path.append(f"{FEATURE_LABELS[n['feature']]}={value:g} {'<=' if go_left else '>'} {n['threshold']:g}")
            node = n["left"] if go_left else n["right"]
        return node, path

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        import pandas as pd

        rows = pd.DataFrame(X)[list(FEATURES)].astype(float).to_numpy()
        return np.array([self.nodes_[self._leaf(r)[0]]["label"] for r in rows], dtype=int)

    def classify(self, profiles: Sequence[Profile]) -> list[ShareClass]:
        out = []
        for p in profiles:
            leaf, _ = self._leaf((p.gpu_util, p.mem_util, p.gpu_mem_mb, float(p.amp)))
            out.append(ShareClass(self.nodes_[leaf]["label"]))
        return out

    def explain(self, profile: Profile) -> str:
        """The splits that decided this profile's class, e.g. 'UG=30 <= 45.1 -> AMP=0 <= 0.5 -> Tiny'."""
        leaf, path = self._leaf((profile.gpu_util, profile.mem_util, profile.gpu_mem_mb, float(profile.amp)))
        counts = self.nodes_[leaf]["counts"]
        label = ShareClass(self.nodes_[leaf]["label"])
        support = f"(leaf: {sum(counts)} training configs, {counts[label]} {label.name.title()})"
        return " -> ".join([*path, label.name.title()]) + " " + support

    def export_text(self) -> str:
        """The tree as indented text."""
        lines: list[str] = []

        def walk(node: int, depth: int) -> None:
            n = self.nodes_[node]
            pad = "|   " * depth
            if n["left"] < 0:
                lines.append(f"{pad}class: {ShareClass(n['label']).name.title()} counts={n['counts']}")
                return
            name = FEATURE_LABELS[n["feature"]]
            lines.append(f"{pad}{name} <= {n['threshold']:g}")
            walk(n["left"], depth + 1)
            lines.append(f"{pad}{name} >  {n['threshold']:g}")
            walk(n["right"], depth + 1)

        walk(0, 0)
        return "\n".join(lines)

    def plot(self, path: str | Path) -> Path:
        """Draw the fitted tree to a PNG (needs the scikit-learn estimator, i.e. a tree fitted here)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from sklearn.tree import plot_tree

        fig, ax = plt.subplots(figsize=(12, 7))
        plot_tree(self.estimator_, feature_names=[FEATURE_LABELS[f] for f in FEATURES],
                  class_names=["Tiny", "Medium", "Jumbo"], filled=True, impurity=True, ax=ax, fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return Path(path)

    # ---- persistence ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "lucid.packing_tree", "features": list(FEATURES), "classes": ["Tiny", "Medium", "Jumbo"],
            "tiny_threshold": self.tiny_threshold, "medium_threshold": self.medium_threshold,
            "label_source": self.label_source, "ccp_alpha": self.ccp_alpha_, "cv_accuracy": self.cv_accuracy_,
            "fit_note": getattr(self, "fit_note_", ""),
            "feature_importances": self.feature_importances_, "nodes": self.nodes_,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PackingTree:
        if data.get("kind") != "lucid.packing_tree":
            raise ValueError("not a lucid packing tree document")
        tree = cls(data["tiny_threshold"], data["medium_threshold"], data["label_source"])
        tree.ccp_alpha_ = data["ccp_alpha"]
        tree.cv_accuracy_ = data["cv_accuracy"]
        tree.fit_note_ = str(data.get("fit_note") or "")
        tree.cross_validated_ = not tree.fit_note_
        tree.feature_importances_ = data["feature_importances"]
        tree.nodes_ = data["nodes"]
        return tree

    def save_json(self, path: str | Path) -> Path:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return Path(path)

    @classmethod
    def load_json(cls, path: str | Path) -> PackingTree:
        return cls.from_dict(json.loads(Path(path).read_text()))


def _nodes_from_sklearn(est: DecisionTreeClassifier) -> list[dict[str, Any]]:
    t = est.tree_
    nodes = []
    for i in range(t.node_count):
        counts = t.value[i][0] * t.n_node_samples[i]  # value holds class fractions in recent scikit-learn
        full = [0, 0, 0]
        for cls_index, cls in enumerate(est.classes_):
            full[int(cls)] = int(np.rint(counts[cls_index]))
        leaf = t.children_left[i] < 0
        nodes.append({
            "feature": None if leaf else FEATURES[t.feature[i]],
            "threshold": None if leaf else float(t.threshold[i]),
            "left": int(t.children_left[i]), "right": int(t.children_right[i]),
            "label": int(est.classes_[int(np.argmax(t.value[i][0]))]), "counts": full,
        })
    return nodes


def default_tree_path() -> Path:
    """The shipped default tree (include/models/packing_tree.json)."""
    from lucid_core.paths import REPO_ROOT

    return REPO_ROOT / "include" / "models" / "packing_tree.json"


@dataclass(frozen=True)
class PairQuality:
    allowed: int
    good: int
    good_allowed: int

    @property
    def precision(self) -> float:
        """Share of allowed pairs whose both speeds stay >= the quality bar (paper: 98.1%)."""
        return self.good_allowed / self.allowed if self.allowed else float("nan")

    @property
    def coverage(self) -> float:
        """Share of all good pairs the binder would allow (paper: 87.0%)."""
        return self.good_allowed / self.good if self.good else float("nan")


def pair_quality(catalog: PackingCatalog, labels: Sequence[int], capacity: int = 2,
                 gpu_memory_mb: float = 24576.0, good_speed: float = 0.85) -> PairQuality:
    """Apply the binder's rule (score sum <= GSS, summed footprints fit) to every measured pair."""
    by_key = dict(zip(catalog.profiles["key"], np.asarray(labels, dtype=int), strict=True))
    mem = dict(zip(catalog.profiles["key"], catalog.profiles["gpu_mem_mb"], strict=True))
    p = catalog.pairs
    score = p["key1"].map(by_key).to_numpy() + p["key2"].map(by_key).to_numpy()
    fits = (p["key1"].map(mem) + p["key2"].map(mem)).to_numpy() <= gpu_memory_mb
    allowed = (score <= capacity) & fits
    good = (p["speed1"].to_numpy() >= good_speed) & (p["speed2"].to_numpy() >= good_speed)
    return PairQuality(int(allowed.sum()), int(good.sum()), int((allowed & good).sum()))
