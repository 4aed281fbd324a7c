"""Monotone shape functions: pool-adjacent-violators on one learned EBM term."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.isotonic import IsotonicRegression


def monotonize_term(ebm: Any, feature_name: str, increasing: bool = True) -> None:
    """Replace a continuous term's shape by its weighted isotonic fit (in place), re-centred into the
    intercept so the other terms keep their meaning. Missing/unseen bins keep their scores."""
    index = list(ebm.term_names_).index(feature_name)
    if len(ebm.term_features_[index]) != 1 or isinstance(ebm.bins_[ebm.term_features_[index][0]][0], dict):
        raise ValueError(f"{feature_name!r} is not a single continuous term")
    scores = np.array(ebm.term_scores_[index], dtype=float)
    weights = np.maximum(np.asarray(ebm.bin_weights_[index], dtype=float)[1:-1], 1e-9)
    inner = scores[1:-1]
    fitted = IsotonicRegression(increasing=increasing).fit(np.arange(len(inner)), inner, sample_weight=weights)
    new = fitted.predict(np.arange(len(inner)))
    shift = float(np.average(new, weights=weights))
    scores[1:-1] = new - shift
    ebm.term_scores_[index] = scores
    ebm.intercept_ = ebm.intercept_ + shift


def is_monotone(values: np.ndarray, increasing: bool = True, tol: float = 1e-12) -> bool:
    """Whether a sequence never steps against the wanted direction."""
    steps = np.diff(np.asarray(values, dtype=float))
    return bool(np.all(steps >= -tol) if increasing else np.all(steps <= tol))
