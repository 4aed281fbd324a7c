"""The drift history says an alert went only once it went, and a retry of the alert task does not send it twice."""

from __future__ import annotations

import json
import socket
from email import message_from_bytes

import pytest
from lucid_af_support import REPO, seed_finished_jobs


class _FlakyInbox:
    """An SMTP handler that refuses every message while `down` (a mail server out for a while)."""

    def __init__(self) -> None:
        self.down = False
        self.refusals_left = 0  # messages still to refuse, down or not
        self.messages: list = []

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd handler hook
        if self.down or self.refusals_left > 0:
            self.refusals_left -= 1
            return "451 try again later"
        self.messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def flaky_smtp(monkeypatch):
    from aiosmtpd.controller import Controller

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    inbox = _FlakyInbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": port,
        "extra": {"disable_tls": True, "disable_ssl": True, "from_email": "lucid@localhost", "timeout": 10,
                  "retry_limit": 0}}))  # one try per task try: the task's own retries are what is tested
    yield inbox
    controller.stop()


def test_a_drift_alert_the_mail_server_refused_is_not_recorded_as_sent(airflow_db, lucid_home, flaky_smtp,
                                                                        monkeypatch):
    """check_drift wrote "alert sent to <recipients>" into the drift history before the alert task ran: a mail
    server that refused the alert left the drift page saying it had gone. A retry then delivers it, once."""
    from datetime import timedelta

    from airflow.dag_processing.dagbag import DagBag

    path = lucid_home / "lucid.db"
    monkeypatch.setenv("AIRFLOW_CONN_LUCID_DB", json.dumps({"conn_type": "sqlite", "host": str(path)}))
    url = f"sqlite:///{path}"
    seed_finished_jobs(url)
    dag = DagBag(dag_folder=str(REPO / "dags")).dags["lucid_update_engine"]
    dag.task_dict["alert"].retries = 0  # the run ends at the refusal instead of waiting out the retry delay
    conf = {"mode": "full", "full_days": 3650, "alert_to": "ops@example.org", "drift_checks_in_a_row": 1}
    dag.test(run_conf=conf, logical_date=None)
    seed_finished_jobs(url, scale=20.0, gpus=8, offset_s=3 * 86400.0, prefix="late-")  # the workload changes
    flaky_smtp.down = True
    run = dag.test(run_conf=conf)
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}
    assert states["check_drift"] == "success" and states["alert"] == "failed", states
    history = sorted((lucid_home / "reports" / "drift").glob("*.json"))[-1]
    data = json.loads(history.read_text())
    assert any(r["drifted"] for r in data["reports"])
    assert data["alert_sent_to"] == "" and flaky_smtp.messages == []

    # the mail server refuses once, the task's retry delivers, and the history records it
    flaky_smtp.down, flaky_smtp.refusals_left = False, 1
    dag.task_dict["alert"].retries, dag.task_dict["alert"].retry_delay = 1, timedelta(seconds=1)
    run = dag.test(run_conf=conf)
    tries = {ti.task_id: ti.try_number for ti in run.get_task_instances()}
    assert str(getattr(run.state, "value", run.state)) == "success" and tries["alert"] == 2, tries
    assert len(flaky_smtp.messages) == 1 and flaky_smtp.messages[0][0] == ["ops@example.org"]
    history = sorted((lucid_home / "reports" / "drift").glob("*.json"))[-1]
    assert json.loads(history.read_text())["alert_sent_to"] == "ops@example.org"


def test_an_alert_recorded_as_sent_is_not_sent_again(tmp_path):
    """A retry of the alert task (or the task cleared by hand) after the mail went sends nothing."""
    from lucid_core.update import alert_sent_to, save_drift_history, send_alert_once

    history = save_drift_history(tmp_path, "run1", [{"model": "duration", "drifted": True}])
    sent: list[int] = []
    assert send_alert_once(history, ["a@example.org", "b@example.org"], lambda: sent.append(1))
    assert not send_alert_once(history, ["a@example.org", "b@example.org"], lambda: sent.append(1))
    assert sent == [1] and alert_sent_to(history) == "a@example.org, b@example.org"
    assert json.loads(history.read_text())["reports"] == [{"model": "duration", "drifted": True}]
