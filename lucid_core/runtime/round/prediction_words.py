"""A duration prediction in words: what the round records beside each prediction, and what `explain` says.

Part of the round room (the round writes these notes when it predicts); the surfaces read them.
"""

from __future__ import annotations

import math
import re
from typing import Any

from lucid_core.policy.predictors import HistoryDurationPredictor
from lucid_core.units import duration_words


def duration_terms(model: Any, job: Any) -> dict[str, Any]:
    """Per-term contributions when the model can give them, else what decided the prediction."""
    if callable(getattr(model, "features_of", None)) and callable(getattr(model, "explain", None)):
        try:  # the GA2M: contributions in log1p-seconds, expm1(intercept + sum) is its estimate
            exp = model.explain(model.features_of([job]))[0]
            return {"model": type(model).__name__, "space": "log1p seconds", "intercept": exp.intercept,
                    "estimate_s": math.expm1(exp.prediction), "terms": [[k, v] for k, v in exp.top(len(
                        exp.contributions))]}
        except Exception as exc:  # an explanation must never break `explain`
            return {"model": type(model).__name__, "error": str(exc)}
    for name in ("explain_one", "explain"):
        fn = getattr(model, name, None)
        if callable(fn):
            try:
                return {"model": type(model).__name__, "terms": fn(job)}
            except Exception as exc:  # an explanation must never break `explain`
                return {"model": type(model).__name__, "error": str(exc)}
    if isinstance(model, HistoryDurationPredictor):
        seconds, source = model.predict_one(job)
        return {"model": "HistoryDurationPredictor", "predicted_s": seconds, "terms": [[source, seconds]]}
    return {"model": type(model).__name__, "terms": []}


#: HistoryDurationPredictor's history keys, in words
_HISTORY_SCOPE = {"user-gpus": "of this user with this GPU count", "user": "of this user",
                  "gpus": "with this GPU count", "all": "of any user"}
_HISTORY_SOURCE = re.compile(r"^(?P<key>\S+) history \((?P<n>\d+) jobs(?P<rest>.*)\)$")


def history_source_words(source: str, seconds: float) -> str:
    """`all history (1 jobs)` and 38815.1 s as `10.8 h from 1 finished job of any user`."""
    match = _HISTORY_SOURCE.match(source)
    if not match:
        return f"{duration_words(seconds)} ({source})"
    n = int(match["n"])
    scope = _HISTORY_SCOPE.get(match["key"], f"({match['key']})")
    rest = match["rest"].strip(" ,")
    return (f"{duration_words(seconds)} from {n} finished job{'' if n == 1 else 's'} {scope}"
            + (f" ({rest})" if rest else ""))


def explain_terms(duration: dict[str, Any]) -> list[str]:
    """The duration model's explanation as lines in words: history sources, or the GA2M's largest terms."""
    if not duration:
        return []
    if duration.get("error"):
        return [f"duration model {duration.get('model')}: no explanation ({duration['error']})"]
    terms = duration.get("terms") or []
    if duration.get("model") == "HistoryDurationPredictor":
        return [f"predicted {history_source_words(str(t[0]), float(t[1]))}" for t in terms
                if isinstance(t, list | tuple) and len(t) == 2]
    if duration.get("space") == "log1p seconds":
        lines = [f"duration model {duration.get('model')}: estimate {duration_words(duration['estimate_s'])}; "
                 "largest terms (x e^term on the duration):"]
        lines += [f"  {name}: {value:+.2f} (x{math.exp(value):.2f})" for name, value in terms[:6]]
        return lines
    return [f"duration term: {t}" for t in (terms if isinstance(terms, list) else [terms])]


def prediction_notes(model: Any, jobs: list[Any]) -> dict[str, str]:
    """What the round records when it predicts jobs' durations: the prediction and its source in words,
    so `explain` can later say what the decision used rather than what the model says now. A GA2M
    explains the whole batch in one call (a burst of new jobs must not cost one call each)."""
    jobs = [job for job in jobs if job.predicted_duration is not None]
    if not jobs:
        return {}
    if callable(getattr(model, "features_of", None)) and callable(getattr(model, "explain", None)):
        name = type(model).__name__
        try:
            explanations = model.explain(model.features_of(jobs))
        except Exception as exc:  # an explanation must never break the round
            return {job.job_id: f"predicted {duration_words(job.predicted_duration)} by {name} "
                                f"(no explanation: {exc})" for job in jobs}
        return {job.job_id: f"predicted {duration_words(job.predicted_duration)} by {name}; largest terms "
                            + ", ".join(f"{k} {v:+.2f}" for k, v in exp.top(3))
                for job, exp in zip(jobs, explanations, strict=True)}
    notes = {}
    for job in jobs:
        lines = [line.strip() for line in explain_terms(duration_terms(model, job))] if model is not None else []
        if lines and lines[0].startswith("predicted "):  # the history predictor says it in one line
            notes[job.job_id] = lines[0]
        else:
            notes[job.job_id] = f"predicted {duration_words(job.predicted_duration)}" + (
                f" ({'; '.join(lines)})" if lines else "")
    return notes
