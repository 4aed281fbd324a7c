"""Explanations of EBM predictions: intercept + one contribution per term, and shape plots."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Explanation:
    """One prediction in the model's own space: prediction == intercept + sum(contributions)."""

    prediction: float
    intercept: float
    contributions: dict[str, float]

    def total(self) -> float:
        return self.intercept + sum(self.contributions.values())

    def top(self, n: int = 5) -> list[tuple[str, float]]:
        """The n terms that moved this prediction most, largest first."""
        return sorted(self.contributions.items(), key=lambda kv: -abs(kv[1]))[:n]

    def as_text(self, n: int = 5) -> str:
        parts = [f"intercept {self.intercept:+.3f}"] + [f"{k} {v:+.3f}" for k, v in self.top(n)]
        return f"{self.prediction:.3f} = " + ", ".join(parts) + (" ..." if len(self.contributions) > n else "")


def explain_ebm(ebm: Any, X: pd.DataFrame) -> list[Explanation]:
    """Per-row intercept and term contributions (eval_terms) of a fitted EBM regressor."""
    terms = np.asarray(ebm.eval_terms(X), dtype=float)
    intercept = float(np.asarray(ebm.intercept_).ravel()[0]) if np.ndim(ebm.intercept_) else float(ebm.intercept_)
    names = list(ebm.term_names_)
    totals = intercept + terms.sum(axis=1)
    return [Explanation(float(totals[i]), intercept, dict(zip(names, map(float, terms[i]), strict=True)))
            for i in range(len(terms))]


def plot_shape_functions(ebm: Any, out_dir: str | Path, prefix: str = "shape") -> list[Path]:
    """One PNG per single-feature term: the learned shape function f_i(x_i)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for term_index, features in enumerate(ebm.term_features_):
        if len(features) != 1:
            continue
        feature = features[0]
        name = ebm.term_names_[term_index]
        scores = np.asarray(ebm.term_scores_[term_index], dtype=float)
        bins = ebm.bins_[feature][0]
        fig, ax = plt.subplots(figsize=(6, 3.2))
        if isinstance(bins, dict):
            labels = sorted(bins, key=bins.get)
            ax.bar(range(len(labels)), [scores[bins[c]] for c in labels])
            ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=6)
        else:
            cuts = np.asarray(bins, dtype=float)
            lo, hi = ebm.feature_bounds_[feature] if ebm.feature_bounds_ is not None else (cuts[0], cuts[-1])
            edges = np.concatenate([[lo], cuts, [hi]]) if len(cuts) else np.array([lo, hi])
            ax.step(edges, np.append(scores[1:-1], scores[-2]), where="post")
        ax.axhline(0.0, color="grey", lw=0.5)
        ax.set_title(f"{prefix}: {name}")
        ax.set_ylabel("contribution")
        fig.tight_layout()
        path = out / f"{prefix}_{_slug(name)}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")
