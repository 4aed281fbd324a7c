"""Lucid Update Engine: keep the duration and throughput models fresh, and say when they drift.

Daily fine-tune on the recent window; a full retrain on Sundays (or when `mode` says so).
extract (job log + submissions per slot from the store) -> validate (Great Expectations suites in
include/gx; bad rows quarantined and reported; training refused when the batch fails) -> train ->
evaluate against the promoted model on the most recent data -> promote or keep -> drift check
(error ratio and input PSI) -> alert over SMTP (Airflow notifier) with the numbers in the message.

No finished job in the window: the run is skipped. Fewer rows than the suites need (a new or quiet fleet):
training is skipped with the reason, and the drift check still scores the serving models on the batch's
clean rows (8 at the least). A batch refused for bad data fails `validate`: no drift check runs on data
that failed its expectations, and the alert task mails the refusal instead.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import Asset, Param, TriggerRule, dag, task

SMTP_DEFAULT = "smtp_default"  # the alert's SMTP connection unless a run names another
#: updated when the Update Engine decides (promote or keep); the live round loads promoted models
LUCID_MODELS = Asset(name="lucid_models")
#: LUCID_UPDATE_SCHEDULE overrides the daily schedule; "none" leaves only triggered runs (the embedded demo)
_SCHEDULE = os.environ.get("LUCID_UPDATE_SCHEDULE") or "@daily"
UPDATE_SCHEDULE = None if _SCHEDULE.lower() == "none" else _SCHEDULE


@dag(
    dag_id="lucid_update_engine",
    schedule=UPDATE_SCHEDULE,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["lucid"],
    doc_md=__doc__,
    params={
        "mode": Param("auto", enum=["auto", "finetune", "full"],
                      description="auto: full retrain on Sundays, fine-tune on other days"),
        "finetune_days": Param(7, type="integer", minimum=1, maximum=365),
        "full_days": Param(90, type="integer", minimum=1, maximum=3650),
        "recent_share": Param(0.2, type="number", exclusiveMinimum=0, exclusiveMaximum=1,
                              description="Most recent share of jobs held out to compare candidate and promoted"),
        "max_quarantine_share": Param(0.05, type="number", minimum=0, maximum=1),
        "drift_mae_ratio": Param(1.25, type="number", minimum=1, maximum=1000),
        "drift_psi": Param(0.2, type="number", minimum=0, maximum=100,
                           description="An input alerts when its PSI passes this, what chance gives at the recent "
                                       "window's size, and what such windows reached within the training window"),
        "drift_checks_in_a_row": Param(2, type="integer", minimum=1, maximum=365,
                                       description="Mail the alert once this many checks of a model in a row "
                                                   "drifted (1: at the first)"),
        "alert_to": Param("lucid-admins@localhost", type="string", minLength=1,
                          description="Recipients, separated by commas or semicolons"),
        "smtp_conn_id": Param(SMTP_DEFAULT, type="string"),
    },
)
def lucid_update_engine():
    @task
    def extract(params=None, logical_date=None, run_id=None, dag_run=None, dag=None) -> dict:
        """Job log and submissions per slot from the store, written as the run's batch files. The run's inputs
        are checked first: a typo in its conf, or recipients no alert could reach, fail before any training."""
        from lucid_airflow.connections import store_url
        from lucid_airflow.run_inputs import refuse_non_finite, refuse_unknown_conf, smtp_connection
        from lucid_airflow.tuning import reports_root, safe_name

        from lucid_core.alerts import alert_recipients
        from lucid_core.update import extract_batch

        conf = getattr(dag_run, "conf", None) or {}
        refuse_unknown_conf(conf, dag.params.keys())  # params: conf merged in
        refuse_non_finite(params)
        alert_recipients(params["alert_to"])
        # one named for this run that does not exist was found only at the alert; the default may be missing where
        # no mail is wanted (the trigger form sends every parameter, so only a changed one counts as named)
        if conf.get("smtp_conn_id", SMTP_DEFAULT) != SMTP_DEFAULT:
            smtp_connection(params["smtp_conn_id"])

        batch = extract_batch(store_url(), reports_root() / "update" / safe_name(run_id), params["mode"],
                              logical_date.timestamp() if logical_date else None,
                              params["finetune_days"], params["full_days"])
        if batch.job_rows == 0:
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(f"no finished job in the {batch.mode} window: nothing to learn from yet")
        return batch.to_dict()

    @task
    def validate(batch: dict, params=None) -> dict:
        """Great Expectations on both frames; refuse training (task fails) when a batch fails for bad data. Too
        few rows is no failure (a new or quiet fleet, every day): train_and_evaluate skips, saying so."""
        from airflow.sdk.exceptions import AirflowFailException

        from lucid_core.update import Batch, validate_batch

        checked = validate_batch(Batch(**batch), params["max_quarantine_share"])
        if checked["refused"] and not checked["too_few_rows"]:
            raise AirflowFailException("training refused: " + checked["refused"])
        return checked

    @task
    def train_and_evaluate(checked: dict, params=None, run_id=None) -> dict:
        """Fit candidates on the older part, score them and the promoted models on the recent part; skipped, with
        the reason, when the batch holds fewer rows than validation needs."""
        from airflow.sdk.exceptions import AirflowSkipException
        from lucid_airflow.connections import store_url

        from lucid_core.update import train_and_evaluate

        if checked["refused"]:  # too few rows (bad data failed validate)
            raise AirflowSkipException("training skipped: " + checked["refused"])

        return train_and_evaluate(store_url(), checked, params["recent_share"], run_id)

    @task(outlets=[LUCID_MODELS])
    def promote_or_keep(evaluation: dict) -> dict:
        """Promote a candidate that is no worse than the promoted model on recent data; else keep."""
        from lucid_airflow.connections import store_url

        from lucid_core.update import promote_or_keep

        return promote_or_keep(store_url(), evaluation)

    @task
    def publish_model_pages(decision: dict) -> list[str]:
        """Shape-function plots of the promoted models and the packing tree, for the plugin's model page."""
        from lucid_airflow.tuning import reports_root

        from lucid_core.update import publish_model_pages

        return publish_model_pages(reports_root() / "models")

    @task(trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)  # runs with training skipped too
    def check_drift(checked: dict, decision: dict | None, params=None, run_id=None) -> dict:
        """Error ratio and input PSI of the promoted models; kept as drift history, which also says how many
        checks in a row each model drifted (the alert waits for `drift_checks_in_a_row`). With training skipped
        (no decision) the models serving now are scored on this batch's clean rows."""
        from lucid_airflow.connections import store_url
        from lucid_airflow.tuning import reports_root

        from lucid_core.update import drift_reports, drifted_checks_before, save_drift_history, serving_evaluation

        if decision is None:
            decision = serving_evaluation(store_url(), checked, run_id)
        root = reports_root() / "drift"
        before = drifted_checks_before(root, run_id)
        reports = drift_reports(decision, params["drift_mae_ratio"], params["drift_psi"],
                                drifted_before=before,
                                checks_to_alert=params["drift_checks_in_a_row"])
        history = save_drift_history(root, run_id, reports)  # the alert task says who it reached
        return {"reports": reports, "history": str(history)}

    # retries: a mail server out for a while does not lose the alert; the trigger rule lets a batch refused for
    # bad data (validate failed, no drift check) reach it, but not a run whose extract failed or skipped
    @task(retries=3, retry_delay=timedelta(minutes=5), trigger_rule=TriggerRule.ALL_DONE_MIN_ONE_SUCCESS)
    def alert(batch: dict, drift: dict | None, params=None) -> list[str]:
        """Send the drift alert through the SMTP notifier, numbers in the subject and body, once per check (a
        retry after it went sends nothing), and record in the drift history who it went to once it went. With
        no drift check (the batch refused for bad data) it mails the refusal, recorded in validation.json."""
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier
        from airflow.sdk import get_current_context
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
        from lucid_airflow.run_inputs import smtp_connection

        from lucid_core.alerts import alert_message, alert_recipients, refusal_message
        from lucid_core.update import refused_for_bad_data, send_alert_once

        if drift is not None:
            message, record = alert_message(drift["reports"]), drift["history"]
        elif (refusal := refused_for_bad_data(batch)) is not None:
            record, message = refusal[0], refusal_message(refusal[1], batch["mode"])
        else:
            raise AirflowSkipException("no drift check ran and no batch was refused: nothing to mail")
        if message is None:
            return []
        recipients = alert_recipients(params["alert_to"])
        try:
            smtp_connection(params["smtp_conn_id"])
        except ValueError as exc:  # a setting to mend, not a mail server out for a while: no retry
            raise AirflowFailException(str(exc)) from None
        notifier = SmtpNotifier(to=recipients, subject=message[0], html_content=message[1],
                                smtp_conn_id=params["smtp_conn_id"])
        send_alert_once(record, recipients, lambda: notifier.notify(get_current_context()))
        return recipients

    batch = extract()
    checked = validate(batch)
    decision = promote_or_keep(train_and_evaluate(checked))
    publish_model_pages(decision)
    alert(batch, check_drift(checked, decision))


lucid_update_engine()
