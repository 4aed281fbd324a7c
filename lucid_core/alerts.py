"""Drift checks of the Update Engine: prediction error rising, or inputs shifting (PSI), and the alert text.

Plain numbers in, a `DriftReport` out; whoever sends the alert (an Airflow notifier, a CLI) only
formats `report.subject` and `report.body`, so the figures in the message are the ones checked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

#: Floor on bin shares so an empty bin does not make PSI infinite.
PSI_EPSILON = 1e-4


def population_stability_index(reference: Sequence[float], current: Sequence[float], bins: int = 10) -> float:
    """PSI of `current` against `reference`, on quantile bins of the reference (0 = same distribution)."""
    ref = np.asarray(reference, dtype=float)
    cur = np.asarray(current, dtype=float)
    ref = ref[np.isfinite(ref)]
    cur = cur[np.isfinite(cur)]
    if ref.size == 0 or cur.size == 0:
        raise ValueError("population_stability_index needs finite values in both samples")
    edges = np.unique(np.quantile(ref, np.linspace(0.0, 1.0, bins + 1)))
    if edges.size < 2:  # a constant reference: one bin for its value, one for anything else
        ref_share = np.array([1.0, 0.0])
        same = np.isclose(cur, ref[0])
        cur_share = np.array([same.mean(), 1.0 - same.mean()])
    else:
        inner = edges[1:-1]
        ref_share = np.bincount(np.searchsorted(inner, ref, side="right"), minlength=inner.size + 1) / ref.size
        cur_share = np.bincount(np.searchsorted(inner, cur, side="right"), minlength=inner.size + 1) / cur.size
    ref_share = np.clip(ref_share, PSI_EPSILON, None)
    cur_share = np.clip(cur_share, PSI_EPSILON, None)
    return float(np.sum((cur_share - ref_share) * np.log(cur_share / ref_share)))


def mean_absolute_error(actual: Sequence[float], predicted: Sequence[float]) -> float:
    """MAE of two equal-length sequences."""
    a = np.asarray(actual, dtype=float)
    p = np.asarray(predicted, dtype=float)
    if a.shape != p.shape or a.size == 0:
        raise ValueError(f"mean_absolute_error needs two non-empty sequences of one length, got {a.size}, {p.size}")
    return float(np.mean(np.abs(a - p)))


@dataclass(frozen=True, slots=True)
class InputShift:
    feature: str
    psi: float
    shifted: bool


@dataclass(frozen=True)
class DriftReport:
    """The numbers behind one drift check and whether they cross the configured thresholds."""

    model: str
    reference_mae: float
    recent_mae: float
    mae_ratio: float
    mae_ratio_threshold: float
    psi_threshold: float
    shifts: tuple[InputShift, ...] = field(default_factory=tuple)
    reference_rows: int = 0
    recent_rows: int = 0

    @property
    def error_drift(self) -> bool:
        return self.mae_ratio > self.mae_ratio_threshold

    @property
    def shifted_features(self) -> list[str]:
        return [s.feature for s in self.shifts if s.shifted]

    @property
    def drifted(self) -> bool:
        return self.error_drift or bool(self.shifted_features)

    @property
    def subject(self) -> str:
        causes = []
        if self.error_drift:
            causes.append(f"error x{self.mae_ratio:.2f}")
        if self.shifted_features:
            causes.append("input shift in " + ", ".join(self.shifted_features))
        state = "DRIFT" if self.drifted else "no drift"
        return f"[Lucid] {state}: {self.model} model" + (f" ({'; '.join(causes)})" if causes else "")

    @property
    def body(self) -> str:
        lines = [
            f"Model: {self.model}",
            f"Reference MAE: {self.reference_mae:.4g} on {self.reference_rows} rows",
            f"Recent MAE: {self.recent_mae:.4g} on {self.recent_rows} rows",
            f"Error ratio: {self.mae_ratio:.3f} (alert above {self.mae_ratio_threshold:.3f})"
            + (" -> ALERT" if self.error_drift else ""),
            f"Input shift (PSI, alert above {self.psi_threshold:.3f}):",
        ]
        lines += [f"  {s.feature}: {s.psi:.4f}" + (" -> ALERT" if s.shifted else "") for s in self.shifts]
        if not self.shifts:
            lines.append("  (no inputs compared)")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(drifted=self.drifted, error_drift=self.error_drift, shifted_features=self.shifted_features,
                   subject=self.subject)
        return out


def check_drift(
    model: str,
    reference_errors: Sequence[float],
    recent_errors: Sequence[float],
    reference_inputs: Mapping[str, Sequence[float]],
    recent_inputs: Mapping[str, Sequence[float]],
    mae_ratio_threshold: float = 1.25,
    psi_threshold: float = 0.2,
) -> DriftReport:
    """Compare recent absolute errors and inputs with the reference window the model was judged on."""
    ref_err = np.abs(np.asarray(reference_errors, dtype=float))
    rec_err = np.abs(np.asarray(recent_errors, dtype=float))
    if ref_err.size == 0 or rec_err.size == 0:
        raise ValueError("check_drift needs errors from both the reference and the recent window")
    reference_mae = float(ref_err.mean())
    recent_mae = float(rec_err.mean())
    ratio = recent_mae / reference_mae if reference_mae > 0 else (math.inf if recent_mae > 0 else 1.0)
    shifts = []
    for feature in sorted(set(reference_inputs) & set(recent_inputs)):
        psi = population_stability_index(reference_inputs[feature], recent_inputs[feature])
        shifts.append(InputShift(feature, psi, psi > psi_threshold))
    return DriftReport(model, reference_mae, recent_mae, ratio, mae_ratio_threshold, psi_threshold,
                       tuple(shifts), int(ref_err.size), int(rec_err.size))


_ADDRESS = re.compile(r"[^@\s<>(),;:\"\[\]]+@[^@\s<>(),;:\"\[\]]+")


def alert_recipients(text: str) -> list[str]:
    """The addresses of a recipients field, split on commas or semicolons (both are common in forms);
    ValueError naming `alert_to` for one that is no address or a field that names none: the alert would fail,
    or reach fewer people than the drift history says, only when a model drifts."""
    from email.utils import getaddresses

    parts = [part.strip() for part in re.split(r"[,;]", text or "") if part.strip()]
    if not parts:
        raise ValueError("alert_to names no recipient: give at least one email address")
    addresses = []
    for part in parts:
        parsed = getaddresses([part])
        address = parsed[0][1] if len(parsed) == 1 else ""
        if not _ADDRESS.fullmatch(address):
            raise ValueError(f"alert_to: {part!r} is not an email address")
        addresses.append(address)
    return addresses


def alert_message(reports: Sequence[Mapping]) -> tuple[str, str] | None:
    """Subject and HTML body of the drift alert for the drifted ones of `reports` (dicts as
    `lucid_core.update.drift_reports` returns them: `drifted`, `subject`, `body`); None when none drifted.

    Braces are escaped: Airflow's SMTP notifier renders subject and body as Jinja templates."""
    from html import escape

    drifted = [r for r in reports if r.get("drifted")]
    if not drifted:
        return None
    subject = "; ".join(str(r["subject"]) for r in drifted)
    body = "".join(f"<h3>{escape(str(r['subject']))}</h3><pre>{escape(str(r['body']))}</pre>" for r in drifted)
    return (subject.replace("{", "(").replace("}", ")"),
            body.replace("{", "&#123;").replace("}", "&#125;"))
