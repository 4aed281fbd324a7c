"""Job-name buckets: Levenshtein distance between names, then affinity propagation.

Names are first normalized (case folded, digit runs replaced by '#') so runs of one sweep
share a form. Affinity propagation is quadratic, so it runs on a deterministic sample of at
most `max_sample` distinct forms; every other name joins its nearest exemplar. That keeps
10,000 distinct names well under a minute.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Levenshtein
from sklearn.cluster import AffinityPropagation

NO_NAME = -1
_DIGITS = re.compile(r"\d+")
_SEPARATORS = re.compile(r"[\s_\-./:]+")


def normalize_name(name: str) -> str:
    """Case-folded name with digit runs as '#' and separators unified, e.g. 'Run-12_lr0.1' -> 'run_#_lr#_#'."""
    return _SEPARATORS.sub("_", _DIGITS.sub("#", name.strip().lower())).strip("_")


class JobNameBucketer:
    """Assigns each job name a bucket id (an exemplar name); empty names get NO_NAME."""

    def __init__(self, max_sample: int = 800, damping: float = 0.9, max_iter: int = 1000,
                 random_state: int = 0) -> None:
        self.max_sample = max_sample
        self.damping = damping
        self.max_iter = max_iter
        self.random_state = random_state

    def fit(self, names: Iterable[str]) -> JobNameBucketer:
        forms = sorted({normalize_name(n) for n in names if n and normalize_name(n)})
        if not forms:
            self.exemplars_: list[str] = []
            self.assigned_: dict[str, int] = {}
            return self
        rng = np.random.default_rng(self.random_state)
        sample = forms if len(forms) <= self.max_sample else sorted(
            rng.choice(np.array(forms, dtype=object), size=self.max_sample, replace=False))
        self.exemplars_ = self._exemplars(list(sample))
        self.assigned_ = dict(zip(forms, self._nearest(forms), strict=True))
        return self

    def _exemplars(self, sample: list[str]) -> list[str]:
        if len(sample) == 1:
            return sample
        distance = process.cdist(sample, sample, scorer=Levenshtein.normalized_distance, dtype=np.float64, workers=1)
        ap = AffinityPropagation(affinity="precomputed", damping=self.damping, max_iter=self.max_iter,
                                 random_state=self.random_state)
        ap.fit(-distance.astype(float))
        centers = getattr(ap, "cluster_centers_indices_", None)
        if centers is None or len(centers) == 0:  # did not converge: every sampled form is its own bucket
            return sample
        return [sample[i] for i in centers]

    def _nearest(self, forms: Sequence[str]) -> np.ndarray:
        distance = process.cdist(list(forms), self.exemplars_, scorer=Levenshtein.normalized_distance,
                                 dtype=np.float64, workers=1)
        return distance.argmin(axis=1).astype(int)

    def transform(self, names: Iterable[str]) -> np.ndarray:
        """Bucket ids; names not seen in fit join their nearest exemplar."""
        names = list(names)
        out = np.full(len(names), NO_NAME, dtype=int)
        if not self.exemplars_:
            return out
        forms = [normalize_name(n) if n else "" for n in names]
        unseen = sorted({f for f in forms if f and f not in self.assigned_})
        if unseen:
            self.assigned_.update(zip(unseen, self._nearest(unseen), strict=True))
        for i, form in enumerate(forms):
            if form:
                out[i] = self.assigned_[form]
        return out

    def bucket_name(self, bucket: int) -> str:
        return "<none>" if bucket == NO_NAME else self.exemplars_[bucket]
