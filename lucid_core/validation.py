"""Validate a training batch with Great Expectations before any model sees it.

The suites live in ``include/gx/*.json``. Row-level expectations name the rows that break them:
those rows are quarantined (kept with their reasons, reported) and the rest is validated again.
Training is refused when the cleaned batch still fails (schema, row count, distribution) or when
too large a share of the batch had to be quarantined.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

DEFAULT_SUITE_DIR = Path(__file__).resolve().parents[1] / "include" / "gx"


@dataclass(frozen=True, slots=True)
class ExpectationFailure:
    """One expectation that did not hold, with what was observed."""

    expectation: str
    column: str
    observed: Any
    unexpected_count: int
    bounds: tuple[Any, Any] = (None, None)  # the expectation's min_value and max_value, when it has them

    def describe(self) -> str:
        """What failed, what was observed and the bound it broke, in one phrase."""
        low, high = self.bounds
        bound = (f"between {low} and {high}" if low is not None and high is not None
                 else f"at least {low}" if low is not None else f"at most {high}" if high is not None else "")
        if self.expectation == "expect_table_row_count_to_be_between":
            return f"{self.observed} rows found, {bound} required ({self.expectation})"
        what = f"{self.expectation}({self.column})"
        seen = f"observed {self.observed}" if self.observed is not None else ""
        count = f"{self.unexpected_count} unexpected row(s)" if self.unexpected_count else ""
        return what + ": " + ", ".join(x for x in (seen, count, f"bound {bound}" if bound else "") if x)


@dataclass
class ValidationOutcome:
    suite: str
    rows: int
    clean: pd.DataFrame
    quarantined: pd.DataFrame  # the bad rows plus a `quarantine_reasons` column
    first_pass_failures: list[ExpectationFailure] = field(default_factory=list)
    clean_failures: list[ExpectationFailure] = field(default_factory=list)
    refused_reason: str | None = None

    @property
    def passed(self) -> bool:
        return self.refused_reason is None

    @property
    def too_few_rows(self) -> bool:
        """Refused only for holding fewer rows than the suite needs (a new or quiet fleet), not for bad data: what
        is left after quarantining breaks no expectation but the row count's lower bound."""
        if self.passed:
            return False
        if self.rows == 0:
            return True
        return bool(self.clean_failures) and all(_below_row_minimum(f) for f in self.clean_failures)

    def summary(self) -> dict[str, Any]:
        """A JSON-safe report for logs, XCom and the drift page."""
        return {
            "suite": self.suite,
            "rows": self.rows,
            "clean_rows": len(self.clean),
            "quarantined_rows": len(self.quarantined),
            "passed": self.passed,
            "too_few_rows": self.too_few_rows,
            "refused_reason": self.refused_reason,
            "failures": [_failure_dict(f) for f in self.first_pass_failures],
            "clean_failures": [_failure_dict(f) for f in self.clean_failures],
            "quarantine_sample": _json_rows(self.quarantined.head(20)),
        }


def _below_row_minimum(failure: ExpectationFailure) -> bool:
    """The failure is the row-count expectation, with fewer rows than its lower bound."""
    low = failure.bounds[0]
    return (failure.expectation == "expect_table_row_count_to_be_between" and low is not None
            and isinstance(failure.observed, int | float) and failure.observed < low)


def _failure_dict(failure: ExpectationFailure) -> dict[str, Any]:
    observed = failure.observed
    if not isinstance(observed, str | int | float | bool | type(None)):
        observed = str(observed)
    return {"expectation": failure.expectation, "column": failure.column, "observed": observed,
            "unexpected_count": failure.unexpected_count, "bounds": list(failure.bounds),
            "description": failure.describe()}


def _json_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(frame.to_json(orient="records", default_handler=str))


def suite_path(name: str, suite_dir: Path | None = None) -> Path:
    """The JSON file of suite `name` (e.g. "job_log")."""
    path = (suite_dir or DEFAULT_SUITE_DIR) / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no Great Expectations suite {name!r} at {path}")
    return path


def load_suite(name: str, suite_dir: Path | None = None):
    """Read a suite from include/gx as a `great_expectations.ExpectationSuite`."""
    import great_expectations as gx

    data = json.loads(suite_path(name, suite_dir).read_text(encoding="utf-8"))
    return gx.ExpectationSuite(name=data["name"], expectations=data["expectations"], meta=data.get("meta"))


def _quiet_gx() -> None:
    """GX logs each documented function at import and draws progress bars: keep task logs readable."""
    logging.getLogger("great_expectations").setLevel(logging.WARNING)


def _run_suite(frame: pd.DataFrame, suite) -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas("lucid_batch")
    asset = source.add_dataframe_asset("frame")
    batch = asset.add_batch_definition_whole_dataframe("whole").get_batch(batch_parameters={"dataframe": frame})
    return batch.validate(suite, result_format={"result_format": "COMPLETE"})


def _failures(result) -> tuple[list[ExpectationFailure], dict[int, list[str]]]:
    failures: list[ExpectationFailure] = []
    bad_rows: dict[int, list[str]] = {}
    for item in result.results:
        if item.success:
            continue
        config = item.expectation_config
        kwargs = dict(config.kwargs)
        column = kwargs.get("column") or "/".join(str(kwargs[k]) for k in ("column_A", "column_B") if k in kwargs)
        details = item.result or {}
        indices = details.get("unexpected_index_list") or []
        failures.append(ExpectationFailure(config.type, column, details.get("observed_value"),
                                           int(details.get("unexpected_count") or len(indices)),
                                           (kwargs.get("min_value"), kwargs.get("max_value"))))
        for index in indices:
            row = index if isinstance(index, int) else int(index.get("index", -1)) if isinstance(index, dict) else -1
            if row >= 0:
                bad_rows.setdefault(row, []).append(f"{config.type}({column})")
    return failures, bad_rows


def validate_frame(frame: pd.DataFrame, suite_name: str, suite_dir: Path | None = None,
                   max_quarantine_share: float = 0.05) -> ValidationOutcome:
    """Run the suite, quarantine the rows it names, validate the rest; refuse when it still fails."""
    _quiet_gx()
    suite = load_suite(suite_name, suite_dir)
    data = frame.reset_index(drop=True)
    failures, bad_rows = _failures(_run_suite(data, suite))
    bad_index = sorted(bad_rows)
    quarantined = data.loc[bad_index].copy()
    quarantined["quarantine_reasons"] = ["; ".join(bad_rows[i]) for i in bad_index]
    clean = data.drop(index=bad_index).reset_index(drop=True)
    outcome = ValidationOutcome(suite.name, len(data), clean, quarantined, failures)
    if len(data) == 0:
        outcome.refused_reason = "the batch is empty"
        return outcome
    share = len(bad_index) / len(data)
    if share > max_quarantine_share:
        outcome.refused_reason = (f"{len(bad_index)} of {len(data)} rows ({share:.1%}) broke row-level "
                                  f"expectations, above the allowed {max_quarantine_share:.1%}")
        return outcome
    if bad_index or failures:
        outcome.clean_failures, _ = _failures(_run_suite(clean, suite))
    if outcome.clean_failures:
        names = "; ".join(f.describe() for f in outcome.clean_failures)
        outcome.refused_reason = (f"after quarantining {len(bad_index)} rows the batch still fails: {names}"
                                  if bad_index else f"the batch fails: {names}")
    return outcome
