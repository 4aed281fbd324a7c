"""Drift checks of the Update Engine: prediction error rising, or inputs shifting (PSI), and the alert text.

Plain numbers in, a `DriftReport` out; whoever sends the alert (an Airflow notifier, a CLI) only
formats `report.subject` and `report.body`, so the figures in the message are the ones checked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

#: Floor on bin shares so an empty bin does not make PSI infinite.
PSI_EPSILON = 1e-4
#: An input counts as shifted only where its PSI is above what two samples of one distribution reach this often.
PSI_NOISE_QUANTILE = 0.99


def _finite(values: Sequence[float]) -> np.ndarray:
    data = np.asarray(values, dtype=float)
    return data[np.isfinite(data)]


def _binning(ref: np.ndarray, bins: int) -> tuple[int, Callable[[np.ndarray], np.ndarray]]:
    """The bins of a reference and the function that gives values their bin: quantile bins, or for a reference
    of at most `bins` distinct values (a discrete input, a constant one) a bin per value and one for values it
    never held. Quantile bins alone would merge a value most jobs share with its neighbours: with 95% of jobs
    on one GPU every decile is 1, and a shift in wider jobs could never show."""
    values = np.unique(ref)
    if values.size <= bins:
        def bin_of_value(data: np.ndarray) -> np.ndarray:
            at = np.minimum(np.searchsorted(values, data), values.size - 1)
            return np.where(np.isclose(values[at], data), at, values.size)

        return values.size + 1, bin_of_value
    inner = np.unique(np.quantile(ref, np.linspace(0.0, 1.0, bins + 1)))[1:-1]
    return inner.size + 1, lambda data: np.searchsorted(inner, data, side="right")


def _psi_of_counts(ref_counts: np.ndarray, cur_counts: np.ndarray) -> np.ndarray:
    """PSI from bin counts (the last axis); shares floored at PSI_EPSILON so an empty bin stays finite."""
    ref_share = np.clip(ref_counts / ref_counts.sum(axis=-1, keepdims=True), PSI_EPSILON, None)
    cur_share = np.clip(cur_counts / cur_counts.sum(axis=-1, keepdims=True), PSI_EPSILON, None)
    return np.sum((cur_share - ref_share) * np.log(cur_share / ref_share), axis=-1)


def population_stability_index(reference: Sequence[float], current: Sequence[float], bins: int = 10) -> float:
    """PSI of `current` against `reference`, on the reference's bins (`_binning`; 0 = same distribution)."""
    ref, cur = _finite(reference), _finite(current)
    if ref.size == 0 or cur.size == 0:
        raise ValueError("population_stability_index needs finite values in both samples")
    count, bin_of = _binning(ref, bins)
    return float(_psi_of_counts(np.bincount(bin_of(ref), minlength=count), np.bincount(bin_of(cur), minlength=count)))


def psi_sampling_noise(reference: Sequence[float], current: Sequence[float], bins: int = 10,
                       quantile: float = PSI_NOISE_QUANTILE, draws: int = 2000) -> float:
    """The PSI that samples of `current`'s size drawn from `reference` itself pass with probability
    1 - `quantile`: what chance alone gives at that size (a bootstrap of `draws`, seeded by the sizes so a
    check gives the same answer twice).

    Simulated rather than taken from PSI's chi-square limit, which small windows are far from: a bin a small
    window leaves empty counts as `PSI_EPSILON`, worth about 0.7 of PSI on its own. Drawn from one month of
    Philly jobs, 50 recent jobs passed 0.2 on submit hour by chance in 39% of draws
    (`benchmarks/bench_drift_noise.py`); a shift is believed only above this floor as well as above the
    threshold.
    """
    ref = _finite(reference)
    size = int(_finite(current).size)
    if ref.size == 0 or size == 0:
        raise ValueError("psi_sampling_noise needs finite values in both samples")
    count, bin_of = _binning(ref, bins)
    ref_bins = bin_of(ref)
    rng = np.random.default_rng([ref.size, size])
    drawn = ref_bins[rng.integers(0, ref.size, size=(draws, size))]  # each row: one sample's bins
    counts = np.bincount((drawn + count * np.arange(draws)[:, None]).ravel(), minlength=draws * count)
    chance = _psi_of_counts(np.bincount(ref_bins, minlength=count), counts.reshape(draws, count))
    return float(np.quantile(chance, quantile))


def window_spread(reference: Sequence[float], values: Sequence[float], window: int,
                  keep: Callable[[np.ndarray], Sequence[float]] = np.asarray, steps_per_window: int = 4) -> float:
    """The largest PSI against `reference` of any `window` consecutive `values` (in time order), stepping a
    quarter window at a time: how far windows of that size stray from the whole within the training window
    itself. `keep` reduces each window as the recent window is reduced before its check. 0 when `values` hold
    fewer than two windows."""
    data = np.asarray(values, dtype=float)
    if window < 1 or data.size < 2 * window:
        return 0.0
    step = max(1, window // steps_per_window)
    return max(population_stability_index(reference, keep(data[start:start + window]))
               for start in range(0, data.size - window + 1, step))


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
    noise: float = 0.0  # the PSI sampling alone reaches at these sample sizes (PSI_NOISE_QUANTILE)
    spread: float = 0.0  # the largest PSI of windows of the recent window's size within the training window

    @property
    def bar(self) -> float:
        """What the PSI had to pass besides the threshold: sampling noise or the training window's own spread."""
        return max(self.noise, self.spread)


#: what a model's errors (MAE) are measured in, for a reader of the alert
ERROR_UNITS = {
    "duration": "absolute error of log(1 + duration in seconds): 0.1 is about 10% off, 0.69 a factor of 2",
    "throughput": "GPU jobs submitted per forecast slot, absolute",
}


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
    in_a_row: int = 1  # checks of this model in a row that drifted, this one included (0: this one did not)
    checks_to_alert: int = 1  # the alert goes out once that many checks in a row drifted

    @property
    def alert(self) -> bool:
        """Drifted in enough checks in a row: one day's burst of odd jobs is not drift, a lasting change is."""
        return self.drifted and self.in_a_row >= self.checks_to_alert

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
        state = ("DRIFT" if self.alert else
                 f"drift, {self.in_a_row} of {self.checks_to_alert} checks in a row" if self.drifted else "no drift")
        return f"[Lucid] {state}: {self.model} model" + (f" ({'; '.join(causes)})" if causes else "")

    @property
    def body(self) -> str:
        unit = ERROR_UNITS.get(self.model)
        lines = [
            f"Model: {self.model}",
            f"Reference MAE: {self.reference_mae:.4g} on {self.reference_rows} rows",
            f"Recent MAE: {self.recent_mae:.4g} on {self.recent_rows} rows",
            *([f"Error unit: {unit}"] if unit else []),
            f"Error ratio: {self.mae_ratio:.3f} (alert above {self.mae_ratio_threshold:.3f})"
            + (" -> ALERT" if self.error_drift else ""),
            f"Input shift (PSI, alert above {self.psi_threshold:.3f}):",
        ]
        lines += [f"  {s.feature}: {s.psi:.4f}" + _bar_note(s, self.psi_threshold) + (" -> ALERT" if s.shifted else "")
                  for s in self.shifts]
        if not self.shifts:
            lines.append("  (no inputs compared)")
        if self.drifted:
            lines.append(f"Checks in a row that drifted: {self.in_a_row} "
                         f"(the alert goes out at {self.checks_to_alert})")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(drifted=self.drifted, alert=self.alert, error_drift=self.error_drift,
                   shifted_features=self.shifted_features, subject=self.subject)
        return out


def _bar_note(shift: InputShift, threshold: float) -> str:
    """Why a PSI above the threshold is or is not an alert, where more than the threshold decided it."""
    if shift.bar <= threshold:
        return ""
    if shift.spread >= shift.noise:
        return f" (windows of this size within the training window reached {shift.spread:.4f})"
    return f" (sampling alone reaches {shift.noise:.4f} at these sizes)"


def check_drift(
    model: str,
    reference_errors: Sequence[float],
    recent_errors: Sequence[float],
    reference_inputs: Mapping[str, Sequence[float]],
    recent_inputs: Mapping[str, Sequence[float]],
    mae_ratio_threshold: float = 1.25,
    psi_threshold: float = 0.2,
    input_spread: Mapping[str, float] | None = None,
) -> DriftReport:
    """Compare recent absolute errors and inputs with the reference window the model was judged on.

    An input counts as shifted when its PSI passes the threshold, what sampling alone reaches at these sizes,
    and `input_spread`: the largest PSI windows of the recent window's size reached within the training window
    (`window_spread`). Submissions come in bursts: checked daily as the Update Engine runs, the Philly trace's
    recent submit hours passed 0.2 on 51 of 52 days with nothing changed, on 10 once the spread counts too
    (`benchmarks/bench_drift_noise.py`), while every 4th job made an 8-GPU job still alerts on all 52.
    """
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
        noise = psi_sampling_noise(reference_inputs[feature], recent_inputs[feature])
        spread = (input_spread or {}).get(feature, 0.0)
        shifts.append(InputShift(feature, psi, psi > max(psi_threshold, noise, spread), noise, spread))
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


def _version_line(report: Mapping) -> str:
    """Which version of the model was checked (the one serving before this run), when the report says."""
    from html import escape

    version = report.get("version")
    if version is None:
        return ""
    return (f"<p>Checked: version {escape(str(version))}, the one serving before this run (a version this run "
            "promoted is on the models page).</p>")


def alert_message(reports: Sequence[Mapping]) -> tuple[str, str] | None:
    """Subject and HTML body of the drift alert for the ones of `reports` that alert (dicts as
    `lucid_core.update.drift_reports` returns them: `alert`, `subject`, `body`; `drifted` where `alert` is
    absent); None when none does.

    Braces are escaped: Airflow's SMTP notifier renders subject and body as Jinja templates."""
    from html import escape

    drifted = [r for r in reports if r.get("alert", r.get("drifted"))]
    if not drifted:
        return None
    subject = "; ".join(str(r["subject"]) for r in drifted)
    body = "".join(f"<h3>{escape(str(r['subject']))}</h3>{_version_line(r)}<pre>{escape(str(r['body']))}</pre>"
                   for r in drifted)
    body += ("<p>What to do: the Lucid drift page (/lucid/drift) keeps every check, the models page (/lucid/models) "
             "the versions and what this run promoted. A full retrain (the lucid_update_engine DAG with mode=full) "
             "fits the recent jobs; if the error stays high after it, the jobs themselves changed (new users, "
             "GPU counts or codes): look at the inputs named above.</p>")
    return _template_safe(subject, body)


def refusal_message(reason: str, mode: str) -> tuple[str, str]:
    """Subject and HTML body of the mail saying the Update Engine refused a `mode` batch for bad data: no drift
    check ran on it, so the refusal is what the admins hear of that run."""
    from html import escape

    subject = f"[Lucid] training refused: the {mode} batch failed validation"
    body = (f"<h3>{escape(subject)}</h3><pre>{escape(reason)}</pre>"
            "<p>No model was trained and no drift check ran on this batch. The clean and quarantined rows and the "
            "failing expectations are in validation.json beside the batch.</p>")
    return _template_safe(subject, body)


def _template_safe(subject: str, body: str) -> tuple[str, str]:
    """Braces escaped: Airflow's SMTP notifier renders subject and body as Jinja templates."""
    return (subject.replace("{", "(").replace("}", ")"),
            body.replace("{", "&#123;").replace("}", "&#125;"))
