"""Pure pieces of the pipeline: grid expansion, ranking, drift numbers, GX quarantine, connection URLs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


def test_expand_grid_is_the_cartesian_product_minus_invalid_threshold_pairs():
    from lucid_core.tuner import expand_grid

    configs = expand_grid({"tprof_s": [100, 200], "tiny_threshold": [0.9, 0.95], "medium_threshold": [0.85, 0.92],
                           "sharing": ["on"], "nprof_gpus": []})
    # (tiny 0.9, medium 0.92) is invalid: medium above tiny
    assert len(configs) == 2 * 3
    assert all(c["binder.sharing"] == "on" for c in configs)
    assert {"profiler.nprof_gpus"} & set(configs[0]) == set()
    assert not any(c["binder.tiny_threshold"] == 0.9 and c["binder.medium_threshold"] == 0.92 for c in configs)


def test_rank_orders_by_objective_and_puts_failures_last():
    from lucid_core.tuner import ConfigResult, rank

    results = [ConfigResult(0, {}, {"avg_jct_s": 5.0, "gpu_utilization": 0.5}),
               ConfigResult(1, {}, error="boom"),
               ConfigResult(2, {}, {"avg_jct_s": 3.0, "gpu_utilization": 0.4})]
    assert [r.index for r in rank(results, "avg_jct")] == [2, 0, 1]
    assert [r.index for r in rank(results, "utilization")] == [0, 2, 1]


def test_applying_a_sweep_changes_only_the_swept_knobs_of_the_live_config(tmp_path):
    from lucid_core.config import load_config
    from lucid_core.tuner import write_config_toml

    live = tmp_path / "lucid.toml"
    live.write_text("[cluster]\ngpu_memory_mb = 81920\n[runtime]\nhost_lost_after_s = 120\n", encoding="utf-8")
    write_config_toml({"profiler.tprof_s": 100, "binder.sharing": "off"}, live)
    applied = load_config(live, env={})
    assert (applied.profiler.tprof_s, applied.binder.sharing) == (100, "off")
    assert applied.cluster.gpu_memory_mb == 81920 and applied.runtime.host_lost_after_s == 120  # kept
    write_config_toml({"profiler.tprof_s": 300}, tmp_path / "new.toml")  # no file yet: defaults + sweep
    assert load_config(tmp_path / "new.toml", env={}).cluster.gpu_memory_mb == 24576
    # knobs at their defaults are not pinned (a later version's defaults reach them); the file's own are kept,
    # even where they equal today's default
    written = (tmp_path / "new.toml").read_text(encoding="utf-8")
    assert "tprof_s = 300" in written and "gpu_memory_mb" not in written and "backfill_margin" not in written
    live.write_text("[orchestrator]\nbackfill_reserved = true\n", encoding="utf-8")
    write_config_toml({"binder.sharing": "off"}, live)
    assert "backfill_reserved = true" in live.read_text(encoding="utf-8")
    assert load_config(live, env={}).binder.sharing == "off"


def test_psi_is_zero_for_the_same_sample_and_large_for_a_shift():
    from lucid_core.alerts import population_stability_index

    rng = np.random.default_rng(0)
    reference = rng.normal(0, 1, 5000)
    assert population_stability_index(reference, reference) == pytest.approx(0.0, abs=1e-9)
    assert population_stability_index(reference, rng.normal(0, 1, 5000)) < 0.02
    assert population_stability_index(reference, rng.normal(1.5, 1, 5000)) > 0.5


def test_drift_report_names_its_numbers():
    from lucid_core.alerts import check_drift

    report = check_drift("duration", [1.0, 1.0], [2.0, 3.0], {"gpus": [1] * 50 + [2] * 50},
                         {"gpus": [8] * 100}, mae_ratio_threshold=1.25, psi_threshold=0.2)
    assert report.mae_ratio == pytest.approx(2.5)
    assert report.error_drift and report.shifted_features == ["gpus"] and report.drifted
    assert "2.500" in report.body and "DRIFT" in report.subject


def test_gx_quarantines_bad_rows_and_keeps_the_rest():
    from lucid_core.validation import validate_frame

    n = 60
    rng = np.random.default_rng(1)
    submit = np.sort(rng.uniform(0, 1e5, n))
    start = submit + 10
    duration = rng.lognormal(7, 1, n)
    frame = pd.DataFrame({"job_id": [f"j{i}" for i in range(n)], "user": [f"u{i % 5}" for i in range(n)],
                          "vc": "a", "name": "x", "gpus": 1, "submit_time": submit, "start_time": start,
                          "end_time": start + duration, "duration": duration, "state": "COMPLETED",
                          "gpu_util": 50.0, "mem_util": 20.0, "gpu_mem_mb": 1000.0, "amp": False})
    frame.loc[4, "gpus"] = 0
    frame.loc[7, "end_time"] = frame.loc[7, "start_time"] - 1
    outcome = validate_frame(frame, "job_log", max_quarantine_share=0.1)
    assert outcome.passed, outcome.refused_reason
    assert sorted(outcome.quarantined["job_id"]) == ["j4", "j7"]
    assert len(outcome.clean) == n - 2
    strict = validate_frame(frame, "job_log", max_quarantine_share=0.01)
    assert not strict.passed and "above the allowed" in strict.refused_reason


def test_store_url_from_airflow_connections():
    from airflow.models.connection import Connection
    from lucid_airflow.connections import sqlalchemy_url

    assert sqlalchemy_url(Connection(conn_id="a", conn_type="sqlite", host="/tmp/x.db")) == "sqlite:////tmp/x.db"
    pg = Connection(conn_id="b", conn_type="postgres", host="127.0.0.1", port=5432, login="u", password="p",
                    schema="lucid")
    assert sqlalchemy_url(pg) == "postgresql+psycopg2://u:p@127.0.0.1:5432/lucid"
    explicit = Connection(conn_id="c", conn_type="generic", extra='{"sqlalchemy_url": "sqlite:///y.db"}')
    assert sqlalchemy_url(explicit) == "sqlite:///y.db"


def test_a_lucid_typed_connection_opens_the_store_everywhere_and_other_types_are_named(tmp_path):
    """include/airflow/README offers conn type `lucid` for LucidHook: the DAGs and every page read the same
    connection through `sqlalchemy_url`, which gave `lucid://...` (no SQLAlchemy dialect: every DAG failed, every
    page was a bare 500). Another type is refused naming the ones that work, and a page says so (503)."""
    from airflow.models.connection import Connection
    from fastapi.testclient import TestClient
    from lucid_airflow.connections import ConnectionProblem, sqlalchemy_url
    from lucid_airflow.web import create_lucid_app

    typed = Connection(conn_id="lucid_db", conn_type="lucid", host="127.0.0.1", port=5432, login="u", schema="lucid")
    assert sqlalchemy_url(typed) == "postgresql+psycopg2://u@127.0.0.1:5432/lucid"
    odd = Connection(conn_id="lucid_db", conn_type="generic", host="127.0.0.1")
    with pytest.raises(ConnectionProblem, match="conn type 'generic' names no Lucid store"):
        sqlalchemy_url(odd)
    client = TestClient(create_lucid_app(lambda: sqlalchemy_url(odd), lambda: tmp_path, protect=False))
    shown = client.get("/queue")
    assert shown.status_code == 503 and "conn type &#x27;generic&#x27; names no Lucid store" in shown.text, shown.text
    api = client.get("/api/jobs")
    assert api.status_code == 503 and "names no Lucid store" in api.json()["detail"]


def test_connection_extras_of_the_wrong_shape_are_named_without_their_values(tmp_path, monkeypatch):
    """What an Airflow connection holds is typed by people: an extra that is a JSON list or not JSON at all,
    a URL or a key that is not text, a host key that would add a second known_hosts line. Each is refused
    naming the connection and the field, never the value; a host's bad connection makes that host alone
    unreachable, and known_hosts gains nothing from it."""
    import json

    from airflow.sdk import Connection
    from lucid_airflow.connections import ConnectionProblem, sqlalchemy_url
    from lucid_airflow.hooks import LucidHook
    from lucid_airflow.round_steps import ConnectionTransport

    from lucid_core.runtime.hosts.executor import HostAddress, HostUnreachable

    for extra, says in (('["sqlite:///x.db"]', "extra must be a JSON object"),
                        ("sqlalchemy_url=sqlite:///x.db", "extra must be a JSON object"),
                        ('{"sqlalchemy_url": 5}', "extra.sqlalchemy_url must be text, not int"),
                        ('{"sqlalchemy_url": ["a"]}', "extra.sqlalchemy_url must be text, not list")):
        conn = Connection(conn_id="lucid_db", conn_type="lucid", extra=extra)
        with pytest.raises(ConnectionProblem, match=says) as refused:
            LucidHook.url_from_connection(conn)
        assert "connection lucid_db" in str(refused.value) and "x.db" not in str(refused.value)
        with pytest.raises(ConnectionProblem):
            sqlalchemy_url(conn)
    import base64
    import struct

    for empty in ("", "{ }", "{\n}", " null "):  # an empty extra, however spaced, is no extra
        conn = Connection(conn_id="lucid_db", conn_type="sqlite", host="/srv/lucid.db", extra=empty)
        assert sqlalchemy_url(conn) == "sqlite:////srv/lucid.db"
    secret = "-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n-----END OPENSSH PRIVATE KEY-----"
    good_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    # paramiko's known_hosts reader lets these escape (not SSHException): a file holding one failed every host
    cut_key = good_key[:-1]  # one character lost in the copy: base64 without its padding
    short_blob = base64.b64decode(good_key.split()[1])[:-1]  # an ed25519 key of 31 bytes
    short_key = "ssh-ed25519 " + base64.b64encode(short_blob[:15] + struct.pack(">I", 31) + short_blob[19:]).decode()
    cases = {"listy": ({"extra": json.dumps([secret])}, "extra must be a JSON object"),
             "numkey": ({"extra": json.dumps({"private_key": {"key": secret}})}, "extra.private_key must be text"),
             "twolines": ({"extra": json.dumps({"host_key": f"{good_key}\n* ssh-rsa {'B' * 68}"})},
                          "extra.host_key must be one public key on one line"),
             "pattern": ({"host": "*", "extra": json.dumps({"host_key": good_key})}, "not a list or a pattern"),
             "cut": ({"extra": json.dumps({"host_key": cut_key})}, "extra.host_key is no public key"),
             "short": ({"extra": json.dumps({"host_key": short_key})}, "extra.host_key is no public key"),
             "port": ({"port": 70000}, "port 70000 is not a TCP port")}
    for name, (fields, _) in cases.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_LUCID_HOST_{name.upper()}", json.dumps(
            {"conn_type": "ssh", "host": "127.0.0.1", "login": "lucid", **fields}))
    monkeypatch.setenv("AIRFLOW_CONN_LUCID_HOST_FINE", json.dumps(
        {"conn_type": "ssh", "host": "127.0.0.1", "port": 2222, "login": "lucid", "extra": {"host_key": good_key}}))
    monkeypatch.setenv("LUCID_KNOWN_HOSTS", str(tmp_path / "none"))
    transport = ConnectionTransport(tmp_path)
    for name, (_, says) in cases.items():
        with pytest.raises(HostUnreachable, match=says) as refused:
            transport._address(HostAddress(name))
        assert f"host {name}: connection lucid_host_{name}" in str(refused.value)
        assert "secret" not in str(refused.value) and "BBBB" not in str(refused.value)
    assert transport.known_hosts.read_text() == ""
    fine = transport._address(HostAddress("fine"))
    assert (fine.address, fine.port) == ("127.0.0.1", 2222)
    assert transport.known_hosts.read_text() == f"[127.0.0.1]:2222 {good_key}\n"
    import paramiko

    assert paramiko.HostKeys(str(transport.known_hosts)).lookup("[127.0.0.1]:2222") is not None


def test_tune_cli_writes_a_ranked_report(tmp_path, capsys):
    import argparse
    import json

    from lucid_af_support import SAMPLE_TRACE

    from lucid_core import tuner

    parser = argparse.ArgumentParser()
    tuner.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["tune", "--trace", str(SAMPLE_TRACE), "--nodes", "2", "--tprof", "100,300",
                              "--sharing", "auto,off", "--out", str(tmp_path / "r")])
    assert args.func(args) == 0
    summary = json.loads((tmp_path / "r" / "report.json").read_text())
    assert summary["configurations"] == 4 and summary["failed"] == 0 and summary["noise"]["draws"] == 3
    out = capsys.readouterr().out
    assert "| rank |" in out and "| - | current |" in out


def _demo_fleet():
    from lucid_core.sim.fleet import Fleet, FleetHost

    # the demo's inventory: a 2-GPU profiling host and two 2-GPU main hosts of VC default
    return Fleet((FleetHost("prof0", 2, "profiling"), FleetHost("main0", 2), FleetHost("main1", 2)))


def test_tuner_on_the_demo_fleet_says_keep_the_current_configuration(tmp_path):
    """Seconds-long jobs end inside any profiling window, so no Tprof or sharing setting changes
    anything on the demo's fleet: the report must say so instead of naming a "best" one."""
    from lucid_core.sim.records import TraceRecord
    from lucid_core.tuner import TunerSettings, expand_grid, run_configuration, sweep_items, write_report

    records = [TraceRecord(f"j{k}", 3.0 * k, 5.0 + (k * 7) % 50, 1 + k % 2, "default", f"u{k % 3}", f"job{k}")
               for k in range(18)]
    settings = TunerSettings(fleet=_demo_fleet())
    items = sweep_items(expand_grid({"tprof_s": [100, 200, 300], "sharing": ["auto", "off"]}))
    assert [i["role"] for i in items].count("current") == 3
    results = [run_configuration(records, i["overrides"], settings, index=i["index"], seed=i["seed"], role=i["role"])
               for i in items]
    assert not [r.error for r in results if r.error]
    summary = write_report(results, settings, tmp_path)
    assert summary["keep_current"] is True and summary["verdict"].startswith("Keep the current configuration")
    assert summary["configurations"] == 6 and summary["noise"]["draws"] == 3
    assert "VC default: 2 main hosts, 4 GPUs; profiling pool: 1 host, 2 GPUs" in summary["cluster"]
    html = (tmp_path / "report.html").read_text()
    first_row = html.split("<tbody>")[1].split("</tr>")[0]
    assert "class='current'" in first_row and "<td>current</td>" in first_row
    assert "overflow" not in html and "class='scroll'" in html  # the page scrolls the table, never cuts it
    assert "Best:" not in (tmp_path / "report.md").read_text()


def test_fleet_replay_keeps_each_vc_on_its_hosts_and_leaves_out_jobs_too_wide_for_it():
    from lucid_core.sim.fleet import Fleet, FleetHost
    from lucid_core.sim.records import TraceRecord
    from lucid_core.tuner import TunerSettings, run_configuration

    fleet = Fleet((FleetHost("a0", 4, vc="a"), FleetHost("b0", 2, vc="b")))
    records = [TraceRecord("wide-b", 0.0, 600.0, 4, "b"), TraceRecord("a1", 0.0, 600.0, 4, "a"),
               TraceRecord("a2", 1.0, 600.0, 4, "a"), TraceRecord("b1", 1.0, 600.0, 2, "b")]
    result = run_configuration(records, {"profiler.enabled": False}, TunerSettings(fleet=fleet))
    assert result.error is None and result.left_out == 1 and result.metrics["jobs"] == 3
    # a2 waits for a1 on VC a's only host although VC b's host is idle after b1: 600 s queueing of 3 jobs
    assert result.metrics["avg_queue_delay_s"] == pytest.approx((0 + 599 + 0) / 3, abs=1.0)


def test_fleet_report_says_a_cprof_sweep_cannot_change_the_inventorys_pool(tmp_path):
    from lucid_core.tuner import ConfigResult, TunerSettings, write_report

    metrics = {"avg_jct_s": 100.0, "avg_queue_delay_s": 10.0, "p999_queue_delay_s": 50.0, "gpu_utilization": 0.5,
               "ended_in_profiling": 1.0, "jobs_shared": 0.0}
    results = [ConfigResult(i, {"profiler.pool_nodes": n}, dict(metrics)) for i, n in enumerate((1, 2))]
    results.append(ConfigResult(2, {}, dict(metrics), role="current"))
    summary = write_report(results, TunerSettings(fleet=_demo_fleet()), tmp_path)
    assert "Cprof values swept (profiler.pool_nodes) do not change it" in summary["cluster"]
    assert summary["keep_current"] is True


def test_verdict_compares_the_best_gain_with_the_measured_noise():
    from lucid_core.tuner import ConfigResult, assess

    current = [ConfigResult(9, {}, {"avg_jct_s": v}, role="current", seed=s) for s, v in enumerate((100, 104, 98))]
    better = assess([ConfigResult(0, {"x": 1}, {"avg_jct_s": 90.0})], current, "avg_jct")
    assert better["keep_current"] is False and better["threshold"] == 6 and better["gain"] == 10
    assert "Configuration #0 improves avg_jct by 10 s" in better["text"]
    within = assess([ConfigResult(0, {"x": 1}, {"avg_jct_s": 95.0})], current, "avg_jct")
    assert within["keep_current"] is True and "varied by 6 s over 3 workload draws" in within["text"]


def test_tune_cli_replays_on_the_stores_inventory_with_fleet(tmp_path, capsys):
    import argparse
    import json

    from lucid_af_support import SAMPLE_TRACE

    from lucid_core import tuner
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store

    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    store = Store(url)
    for name, pool, gpus in (("prof0", "profiling", 4), ("main0", "main", 8), ("main1", "main", 8)):
        add_host(store, HostSpec(name, pool=pool, executor="local", gpus=gpus, workdir=str(tmp_path / name)))
    store.dispose()
    parser = argparse.ArgumentParser()
    tuner.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["tune", "--trace", str(SAMPLE_TRACE), "--fleet", "--store", url, "--tprof", "200",
                              "--sharing", "auto", "--out", str(tmp_path / "r")])
    assert args.func(args) == 0
    summary = json.loads((tmp_path / "r" / "report.json").read_text())
    assert summary["main_nodes"] is None and [h["name"] for h in summary["fleet"]["hosts"]] == ["main0", "main1",
                                                                                                  "prof0"]
    assert "2 main hosts, 16 GPUs; profiling pool: 1 host, 4 GPUs" in summary["cluster"]
    assert "Cluster: the live fleet" in capsys.readouterr().out
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    args = parser.parse_args(["tune", "--trace", str(SAMPLE_TRACE), "--fleet", "--store", empty, "--out",
                              str(tmp_path / "r2")])
    with pytest.raises(ValueError, match="no main host with GPUs: add hosts"):
        args.func(args)


def test_update_engine_steps_on_a_postgresql_store(tmp_path, monkeypatch):
    """The production store is PostgreSQL: extract, validate, train, promote and drift run there too."""
    import uuid

    psycopg2 = pytest.importorskip("psycopg2")
    from lucid_af_support import seed_finished_jobs

    from lucid_core.update import drift_reports, extract_batch, promote_or_keep, train_and_evaluate, validate_batch

    try:
        admin = psycopg2.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", connect_timeout=3)
    except psycopg2.OperationalError as exc:
        pytest.skip(f"PostgreSQL on 127.0.0.1:5432 is not reachable ({exc})")
    admin.autocommit = True
    database = f"lucid_af_update_{uuid.uuid4().hex[:8]}"
    with admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{database}"')
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    url = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}"
    try:
        seed_finished_jobs(url)
        decisions, reports = [], []
        for step in range(2):
            if step == 1:
                seed_finished_jobs(url, scale=20.0, gpus=8, offset_s=3 * 86400.0, prefix="late-")
            batch = extract_batch(url, tmp_path / f"batch{step}", "full", None, 7, 3650)
            checked = validate_batch(batch)
            assert checked["refused"] == "", checked["refused"]
            decision = promote_or_keep(url, train_and_evaluate(url, checked, 0.2, f"run{step}"))
            decisions.append(decision["decisions"])
            reports.append(drift_reports(decision, 1.25, 0.2))
        assert decisions[0]["duration"]["action"] == "promote" and reports[0] == []
        duration = next(r for r in reports[1] if r["model"] == "duration")
        assert duration["drifted"] and duration["mae_ratio"] > 1.25
        # the training window's own spread was kept at promotion and read back from the store for the check,
        # and the late jobs' 8 GPUs lie outside it
        spread = decision["evaluation"]["models"]["duration"]["promoted_reference_spread"]
        assert set(spread) == {"gpus", "submit_hour", "gpu_util"}, spread
        assert "gpus" in duration["shifted_features"], duration
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.close()


def test_the_tuners_apply_changes_what_the_next_round_reads(tmp_path, monkeypatch):
    """LUCID_CONFIG unset: apply writes LUCID_HOME/lucid.toml, and the round (DAG task and `lucid round`),
    the pages and `lucid tune` all read that file (before, only the tuner fell back to it)."""
    import argparse

    from lucid_airflow import round_steps, tuning

    from lucid_core.config import live_config_path, load_live_config
    from lucid_core.runtime.surfaces.cli.context import config_of
    from lucid_core.tuner import write_config_toml

    monkeypatch.delenv("LUCID_CONFIG", raising=False)
    monkeypatch.setenv("LUCID_HOME", str(tmp_path))
    assert live_config_path() == tmp_path / "lucid.toml"
    assert load_live_config().profiler.tprof_s == 200  # no file yet: the defaults
    write_config_toml({"profiler.tprof_s": 100, "binder.sharing": "off"}, live_config_path())  # what apply_best does
    rnd = round_steps._round(f"sqlite:///{tmp_path / 'lucid.db'}", tmp_path)
    assert (rnd.config.profiler.tprof_s, rnd.config.binder.sharing) == (100, "off")
    args = argparse.Namespace(config=None, set=["binder.sharing=on"])
    assert config_of(args).profiler.tprof_s == 100 and config_of(args).binder.sharing == "on"
    assert tuning.current_config().profiler.tprof_s == 100
    monkeypatch.setenv("LUCID_CONFIG", str(tmp_path / "other.toml"))  # set: it wins, for every reader alike
    assert live_config_path() == tmp_path / "other.toml"
    assert load_live_config().profiler.tprof_s == 200
    rnd.store.dispose()


@pytest.mark.parametrize(("text", "recipients"), [
    ("ops@example.org", ["ops@example.org"]),
    ("ops@example.org; dev@example.org", ["ops@example.org", "dev@example.org"]),  # a mail client's separator
    ("Ops <ops@example.org>,dev@example.org ,", ["ops@example.org", "dev@example.org"]),
    ("lucid-admins@localhost", ["lucid-admins@localhost"]),
])
def test_alert_recipients_split_on_commas_and_semicolons(text, recipients):
    from lucid_core.alerts import alert_recipients

    assert alert_recipients(text) == recipients


@pytest.mark.parametrize(("text", "said"), [
    ("", "names no recipient"), (" ; , ", "names no recipient"), ("ops at example.org", "is not an email address"),
    ("a@b@c", "is not an email address"), ("ops@example.org, dev", "'dev' is not an email address"),
])
def test_alert_recipients_refuse_what_no_alert_could_reach(text, said):
    from lucid_core.alerts import alert_recipients

    with pytest.raises(ValueError, match=said):
        alert_recipients(text)


def test_a_trace_path_must_lie_in_the_trace_folders_even_through_a_link(tmp_path, monkeypatch):
    from lucid_airflow.run_inputs import checked_trace_path

    folder, outside = tmp_path / "traces", tmp_path / "secret.csv"
    folder.mkdir()
    outside.write_text("TOKEN=value\n")
    (folder / "t.csv").write_text("job_id\n")
    (folder / "link.csv").symlink_to(outside)
    monkeypatch.setenv("LUCID_TRACES_DIR", str(folder))
    assert checked_trace_path(str(folder / "t.csv")) == (folder / "t.csv").resolve()
    for path in (str(outside), str(folder / "link.csv"), str(folder / ".." / "secret.csv"), "/proc/self/environ"):
        with pytest.raises(ValueError, match="outside the folders tuner runs may read traces from"):
            checked_trace_path(path)
    with pytest.raises(ValueError, match="is not a file"):
        checked_trace_path(str(folder))
    monkeypatch.delenv("LUCID_TRACES_DIR")
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    with pytest.raises(ValueError, match=str(tmp_path / "home" / "traces")):  # the default folder
        checked_trace_path(str(folder / "t.csv"))


@pytest.mark.parametrize(("value", "said"), [(float("nan"), "got nan"), (float("inf"), "got inf"),
                                             (10**400, "got an integer past a float's range")],
                         ids=["nan", "inf", "huge-integer"])
def test_a_run_parameter_that_is_no_finite_number_is_refused_naming_it(value, said):
    """A form's schema checks ranges, and NaN passes every one (`x > NaN` is never true): a NaN drift threshold
    turned the drift check off without a word."""
    from lucid_airflow.run_inputs import refuse_non_finite

    refuse_non_finite({"drift_psi": 0.2, "mode": "full", "drift_checks_in_a_row": 2, "strict": True})
    with pytest.raises(ValueError, match=f"parameter 'drift_mae_ratio' must be a finite number, {said}"):
        refuse_non_finite({"drift_psi": 0.2, "drift_mae_ratio": value})


def test_a_connection_given_as_a_sqlalchemy_uri_keeps_working():
    """Airflow keeps a URI's scheme as the conn type (`postgresql+psycopg2`): its URI is the store's URL, as before
    the conn types were checked."""
    from airflow.models.connection import Connection
    from lucid_airflow.connections import sqlalchemy_url

    uri = "postgresql+psycopg2://lucid:pw@lucid-db.internal:5432/lucid"
    assert sqlalchemy_url(Connection(conn_id="lucid_db", uri=uri)) == uri


def test_the_smtp_check_fails_for_good_only_on_a_connection_that_does_not_exist(monkeypatch):
    """A lookup that failed for a while (the execution API restarting) is not "no such connection": it must not
    turn into an alert failed without retries."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException
    from lucid_airflow.run_inputs import smtp_connection

    def missing(conn_id):
        raise AirflowNotFoundException(f"The conn_id `{conn_id}` isn't defined")

    monkeypatch.setattr(BaseHook, "get_connection", staticmethod(missing))
    with pytest.raises(ValueError, match="smtp_conn_id 'nope' names no Airflow connection"):
        smtp_connection("nope")

    def unreachable(conn_id):
        raise ConnectionError("execution API unreachable")

    monkeypatch.setattr(BaseHook, "get_connection", staticmethod(unreachable))
    with pytest.raises(ConnectionError):
        smtp_connection("smtp_default")


def test_model_metrics_past_a_floats_range_do_not_fail_the_models_page():
    from lucid_airflow.web import metrics_words

    assert metrics_words({"reference_mae": 10**400, "train_rows": 5}) == "trained on 5 jobs"
    assert metrics_words({"fit_seconds": 10**400, "training_window": [float("inf"), 1.0]}) == ""
    assert metrics_words(["not", "a", "mapping"]) == "['not', 'a', 'mapping']"
