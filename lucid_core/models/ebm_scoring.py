"""Scores of a fitted EBM regressor read straight from its own tables: bins, term scores, intercept.

The EBM is additive: a row's score is the intercept plus, per term, the score of the bin (or bin pair)
its values fall in. `ExplainableBoostingRegressor.predict` gets there through input checks and column
unification that cost about half a millisecond per call whatever the row count, most of a live round's
warm decision (16 new jobs). This does the lookup with numpy on the design frame's columns. It handles
continuous features and nominal string features, as the duration model's design has; for anything else
it returns None and the caller uses the EBM's own `predict`. A test checks both agree row for row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

SMALL_BATCH = 64  # up to this many rows a nominal column is mapped value by value; above, by its distinct values


def score_ebm(ebm: Any, X: Mapping[str, Any]) -> np.ndarray | None:
    """intercept + sum of term scores per row of `X` (a frame, or equal-length columns by the EBM's
    feature names), or None when the EBM has a link, feature type or column this lookup does not cover."""
    scorer = EbmScorer.of(ebm)
    return None if scorer is None else scorer.score(X)


@dataclass(frozen=True)
class EbmScorer:
    """An EBM's tables read once into arrays (cuts, categories, term scores), so each call only bins and
    adds: a live round scores a handful of rows, where reading the tables again cost a third of the call."""

    intercept: float
    columns: tuple[str, ...]  # the feature each binning reads
    binnings: tuple[tuple[str, Any], ...]  # (feature type, cuts array or category dict) per (feature, level)
    terms: tuple[tuple[tuple[int, ...], np.ndarray], ...]  # (binnings it indexes, scores) in the EBM's order

    @classmethod
    def of(cls, ebm: Any) -> EbmScorer | None:
        """The scorer of a fitted regressor, or None where a link or feature type is not covered."""
        if getattr(ebm, "link_", "identity") != "identity" or np.ndim(ebm.intercept_) != 0:
            return None
        names, types = list(ebm.feature_names_in_), list(ebm.feature_types_in_)
        if any(t not in ("continuous", "nominal") for t in types):
            return None
        slots: dict[tuple[int, int], int] = {}
        columns: list[str] = []
        binnings: list[tuple[str, Any]] = []
        terms = []
        for features, scores in zip(ebm.term_features_, ebm.term_scores_, strict=True):
            index = []
            for f in features:
                level = min(len(ebm.bins_[f]), len(features))  # pairs use the coarser cuts when a feature has them
                if (f, level) not in slots:
                    table = ebm.bins_[f][level - 1]
                    if types[f] == "nominal" and not isinstance(table, dict):
                        return None
                    slots[(f, level)] = len(binnings)
                    columns.append(names[f])
                    binnings.append((types[f], table if types[f] == "nominal" else np.asarray(table, dtype=float)))
                index.append(slots[(f, level)])
            terms.append((tuple(index), np.asarray(scores, dtype=float)))
        return cls(float(ebm.intercept_), tuple(columns), tuple(binnings), tuple(terms))

    def score(self, X: Mapping[str, Any]) -> np.ndarray | None:
        """intercept + sum of term scores per row, or None (a column missing, a nominal value not text)."""
        if any(c not in X for c in self.columns):
            return None
        bins = []
        for column, (kind, table) in zip(self.columns, self.binnings, strict=True):
            found = _bin_column(X[column], table, kind)
            if found is None:
                return None
            bins.append(found)
        total = np.full(len(bins[0]) if bins else len(X[next(iter(X))]), self.intercept)
        for index, scores in self.terms:
            total += scores[bins[index[0]]] if len(index) == 1 else scores[tuple(bins[i] for i in index)]
        return total


def _bin_column(column: Any, cuts_or_categories: Any, kind: str) -> np.ndarray | None:
    """Bin index per value: 0 for missing, then the cut intervals (a value on a cut goes above it) or the
    categories in order, and the last bin (-1) for a category the EBM never saw."""
    if kind == "continuous":
        values = (column.to_numpy(dtype=float, na_value=np.nan) if isinstance(column, pd.Series)
                  else np.asarray(column, dtype=float))
        index = np.searchsorted(cuts_or_categories, values, side="right") + 1
        index[np.isnan(values)] = 0
        return index
    if not isinstance(cuts_or_categories, dict):
        return None
    values = (column.to_numpy(dtype=object, na_value=None) if isinstance(column, pd.Series)
              else np.asarray(column, dtype=object))
    get = cuts_or_categories.get
    if len(values) <= SMALL_BATCH:
        if any(v is not None and not isinstance(v, str) for v in values):
            return None  # interpret turns other values into strings its own way: leave those to it
        return np.fromiter((0 if v is None else get(v, -1) for v in values), dtype=np.int64, count=len(values))
    codes, uniques = pd.factorize(values)  # missing values get code -1
    if any(not isinstance(u, str) for u in uniques):
        return None
    mapped = np.append(np.fromiter((get(u, -1) for u in uniques), dtype=np.int64, count=len(uniques)), 0)
    return mapped[codes]  # code -1 takes the appended 0: the missing bin
