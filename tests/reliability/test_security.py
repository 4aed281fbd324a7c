"""Security: shell metacharacters never run anything, host-key mismatch refused, no secret leaks,
every route refuses unauthenticated and wrong-role requests, log reads stay in the job's run directory."""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lucid_invariants import TERMINAL
from runtime_helpers import SETTINGS, fast_config, jobs_by_id, one_round, register, runs_of
from sqlalchemy import func, select

from lucid_core.runtime.hosts.executor import HostAddress, HostKeyRejected, LaunchSpec
from lucid_core.runtime.hosts.launch import launch_script
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.hosts.ssh_executor import SshTransport
from lucid_core.runtime.store.schema import HostRow, JobRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, SubmissionError, submit

REPO = Path(__file__).resolve().parents[2]
NASTY = ["$(touch {c})", "`touch {c}`", "'; touch {c}; '", '"; touch {c}; "', "x\ntouch {c}\n",
         "$(touch${{IFS}}{c})", "%s%n%x%%", "\\'\\\"\\\\", "-e touch {c}", "a;touch {c}&", "|touch {c}",
         "$((1+1))${{HOME}}$PATH", "\x1b[31mred", "!!:0 ~root *", "{c}"]


def nasty(canary: Path) -> list[str]:
    return [s.format(c=canary) for s in NASTY]


# ------------------------------------------------------------------------------------------ injection
@pytest.mark.ssh
def test_metacharacters_in_name_user_env_and_argv_never_run_on_a_real_sshd_host(sshd_hosts, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    register(store, sshd_hosts, tmp_path / "hosts")
    canary = tmp_path / "canary"
    values = nasty(canary)
    env = {f"V{i}": v for i, v in enumerate(values)}
    env_out, argv_out = tmp_path / "env.json", tmp_path / "argv.json"
    dump_env = shlex.join(["python3", "-c", "import json, os; json.dump({k: os.environ[k] for k in os.environ "
                           f"if k[:1] == 'V' and k[1:].isdigit()}}, open({str(env_out)!r}, 'w'))"])
    jobs = [submit(store, JobRequest(dump_env, 1, values[i % len(values)][:128], "vc-a", name=values[i], env=env))
            for i in range(2)]
    argv = ["python3", "-c", f"import json, sys; json.dump(sys.argv[1:], open({str(argv_out)!r}, 'w'))", *values]
    jobs.append(submit(store, JobRequest(argv, 1, "mallory", "vc-a", name="argv")))
    deadline = time.monotonic() + 30
    while not all(r.state in TERMINAL for r in jobs_by_id(store).values()):
        one_round(store, sshd_hosts, fast_config())
        assert time.monotonic() < deadline, {j: r.state for j, r in jobs_by_id(store).items()}
        time.sleep(0.2)
    rows = jobs_by_id(store)
    assert {r.state for r in rows.values()} == {"COMPLETED"}, {j: r.end_reason for j, r in rows.items()}
    assert not canary.exists(), "a metacharacter in a name, user, env value or argument ran a command"
    assert json.loads(env_out.read_text()) == env  # the job saw every value byte for byte
    assert json.loads(argv_out.read_text()) == values
    # nothing but run directories appears, and the jobs' working directories under .work (the emulated
    # telemetry's shared GPU table and the ledger of live runs are the host's own)
    hosts = tmp_path / "hosts"
    host_dirs = [p for p in hosts.rglob("*") if p.is_dir() and p.parent.parent == hosts
                 and p.name not in {".emulated-gpus", ".claims", ".work"}]
    run_ids = sorted(r.run_id for j in jobs for r in runs_of(store, j))
    assert sorted(p.name for p in host_dirs) == run_ids
    assert sorted(p.name for p in hosts.glob("*/.work/*")) == run_ids
    store.dispose()


def test_env_names_with_metacharacters_are_refused_before_anything_is_written(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host

    add_host(store, HostSpec("m0", executor="local", vc="vc-a", gpus=1, workdir=str(tmp_path / "m0")))
    for key in ["A;touch x", "$(id)", "A B", "A=B", "1A", "A-B", "", "A\nB", "LUCID_JOB_ID", "CUDA_VISIBLE_DEVICES"]:
        with pytest.raises(SubmissionError) as refused:
            submit(store, JobRequest("true", 1, "u", "vc-a", env={key: "v"}))
        assert list(refused.value.errors) == [f"env.{key}"]
        if key and not key.startswith(("LUCID_", "CUDA_")):
            with pytest.raises(ValueError, match="environment variable name"):
                launch_script("/tmp/w", "r1", "true", {key: "v"})
    with store.session() as s:
        assert s.scalar(select(func.count()).select_from(JobRow)) == 0
    store.dispose()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                     max_size=80),
       arg=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=80))
def test_any_env_value_or_argument_reaches_the_job_verbatim_and_runs_nothing(tmp_path_factory, value, arg):
    root = tmp_path_factory.mktemp("inj")
    canary = root / "canary"
    value, arg = value.replace("CANARY", str(canary)), arg.replace("CANARY", str(canary))
    out = root / "out.json"
    command = shlex.join([sys.executable, "-c", "import json, os, sys; json.dump([os.environ['V'], sys.argv[1]], "
                          f"open({str(out)!r}, 'w'))", arg])
    executor = local_executor()
    host = HostAddress("h", executor="local", workdir=str(root / "w"))
    executor.launch(host, LaunchSpec("r1", command, {"V": value}))
    deadline = time.monotonic() + 10
    while executor.poll(host, ["r1"])["r1"].state != "EXITED":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert executor.poll(host, ["r1"])["r1"].exit_code == 0
    assert json.loads(out.read_text()) == [value, arg]
    assert not canary.exists()


def test_a_job_that_rewrites_its_run_marker_with_metacharacters_runs_nothing_at_its_stop(tmp_path):
    """The stop reads the run's marker back from the run directory, which a job on an `account` host can
    reach and write on purpose: whatever it holds, the stop runs nothing from it and still stops the job's group."""
    canary = tmp_path / "canary"
    executor = local_executor()
    host = HostAddress("h", executor="local", workdir=str(tmp_path / "w"))
    values = [*nasty(canary), "*", "-e", "../r0", "LUCID_RUN_MARKER=x\nLUCID_RUN_MARKER=y"]
    for i, value in enumerate(values):
        control = shlex.quote(str(tmp_path / "w" / f"r{i}"))  # its control directory, reached on purpose
        executor.launch(host, LaunchSpec(f"r{i}", f"printf '%s\\n' {shlex.quote(value)} > {control}/marker; sleep 60"))
    for i, value in enumerate(values):
        marker = tmp_path / "w" / f"r{i}" / "marker"
        deadline = time.monotonic() + 10
        while not marker.exists() or marker.read_text() != value + "\n":
            assert time.monotonic() < deadline, (value, marker.read_text() if marker.exists() else None)
            time.sleep(0.02)
        status = executor.stop(host, f"r{i}", "cancel", grace_s=2)
        assert (status.state, status.exit_code, status.stop_requested, status.escaped) == ("EXITED", 143, True, 0)
    assert not canary.exists()


# ------------------------------------------------------------------------------------------ host keys
@pytest.mark.ssh
def test_a_host_key_that_does_not_match_known_hosts_is_refused_without_retry(sshd_hosts, tmp_path):
    import subprocess

    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    port = sshd_hosts.hosts["prof0"].port
    key_type, key = Path(str(impostor) + ".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {key_type} {key}\n")
    transport = SshTransport(str(known), connect_timeout_s=2, retries=3, backoff_s=1.0)
    host = HostAddress("prof0", "127.0.0.1", port, sshd_hosts.user, str(sshd_hosts.client_key),
                       str(tmp_path / "runs"))
    t0 = time.monotonic()
    with pytest.raises(HostKeyRejected, match="does not match") as rejected:
        transport.run_script(host, f"touch {tmp_path / 'ran'}\n", 5)
    assert rejected.value.reached is False  # refused before any login: a launch there started nothing
    assert time.monotonic() - t0 < 1.0, "a rejected key was retried"
    assert transport.connects == 0 and not (tmp_path / "ran").exists()
    # through a round: the host is marked unreachable with the reason, and nothing is launched there
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    register(store, sshd_hosts, tmp_path / "hosts", gpus={"prof0": 1, "main0": 1})
    job = submit(store, JobRequest("true", 1, "u", "vc-a"))
    lines = [line for line in sshd_hosts.known_hosts.read_text().splitlines() if f"]:{port} " not in line]
    known.write_text("\n".join([*lines, f"[127.0.0.1]:{port} {key_type} {key}"]) + "\n")
    cluster = type("Cluster", (), {"known_hosts": known, "hosts": sshd_hosts.hosts})()
    # no idle probe (it would find the key refused before any placement): the launch meets it
    report = one_round(store, cluster, fast_config(), settings=replace(SETTINGS, idle_probe_s=None))
    with store.session() as s:
        prof = s.get(HostRow, "prof0")
    assert "prof0" in report.unreachable and not prof.reachable and "does not match" in prof.last_error
    assert not (tmp_path / "hosts" / "prof0").exists()
    # the key was refused before any login: the run ends unlaunched and the job waits for a host that answers
    assert [(r.state, r.started_at) for r in runs_of(store, job)] == [("ended", None)]
    assert jobs_by_id(store)[job].state == "SUBMITTED"
    store.dispose()


# ------------------------------------------------------------------------------------------ secrets
def _hosts(store):
    with store.session() as s:
        return list(s.scalars(select(HostRow)))


SECRET_ENV = "env-S3cret-Value-77aa1"


def _private_key_body(path: Path) -> str:
    lines = path.read_text().splitlines()
    return max(lines[1:-1], key=len)  # a line of the key material itself


@pytest.mark.postgres
def test_no_secret_in_logs_decisions_errors_api_pages_or_cli(throwaway_pg, fresh_pg_store, tmp_path, caplog,
                                                                 capsys):
    from fault_injection import RestartingRound, add_local_hosts
    from sqlalchemy.engine import make_url

    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.hosts.ssh_executor import ssh_executor

    caplog.set_level(logging.DEBUG)
    store = fresh_pg_store
    add_local_hosts(store, tmp_path / "hosts")
    import subprocess

    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    add_host(store, HostSpec("gone", address="127.0.0.1", port=1, user="lucid", key_path=str(key), vc="vc-b",
                             gpus=1))  # an SSH host with a key that never answers
    from lucid_core.runtime.hosts.inventory import drain_host

    drain_host(store, "gone")  # no work for it: its key only has to stay out of every page and error
    known = tmp_path / "known_hosts"
    known.write_text("")
    jobs = [submit(store, JobRequest(body, 1, "u", "vc-a", env={"API_TOKEN": SECRET_ENV}))
            for body in ("sleep 0.2", "sleep 2.3", "exit 7")]
    from lucid_core.runtime.hosts.executor import HostUnreachable
    from lucid_core.runtime.hosts.inventory import host_address

    with store.session() as s:
        gone = host_address(s.get(HostRow, "gone"))
    with pytest.raises(HostUnreachable) as unreachable:
        ssh_executor(str(known), connect_timeout_s=1, retries=0).poll(gone, ["r1"])
    errors: list[str] = [str(unreachable.value)]
    steps = ["during_record", "after_launch", "after_reconcile"]
    deadline = time.monotonic() + 40
    i = 0
    while not all(r.state in TERMINAL for r in jobs_by_id(store).values()):
        rnd = RestartingRound(store, ssh_executor(str(known), connect_timeout_s=1, retries=0), fast_config(),
                              None, server=throwaway_pg, restart_at=steps[i] if i < len(steps) else "")
        try:
            errors += rnd.run().errors
        except Exception as exc:  # what a DAG task would log
            errors.append(f"{type(exc).__name__}: {exc}")
        i += 1
        assert time.monotonic() < deadline, ({j: (r.state, r.pending_reason, r.end_reason)
                                              for j, r in jobs_by_id(store).items()}, errors[:4],
                                             [(h.name, h.reachable, h.last_error) for h in _hosts(store)])
        time.sleep(0.2)
    assert any("OperationalError" in e for e in errors), errors  # the error paths were really taken
    texts = ["\n".join(errors), caplog.text]
    with store.session() as s:
        from sqlalchemy import text

        for table, columns in {"decisions": "reason, payload", "job_events": "message", "rounds": "error",
                               "hosts": "last_error, key_path", "runs": "outcome",
                               "jobs": "name, end_reason, pending_reason"}.items():
            texts += [str(row) for row in s.execute(text(f"SELECT {columns} FROM {table}"))]
    # the HTTP API and the web pages
    from fastapi.testclient import TestClient

    from lucid_core.runtime.surfaces.api import create_app

    api = TestClient(create_app(store.url, store=store))
    for path in ["/queue", "/hosts", *[f"/jobs/{j}" for j in jobs], *[f"/jobs/{j}/explain" for j in jobs]]:
        response = api.get(path)
        assert response.status_code == 200, (path, response.text)
        texts.append(response.text)
    sys.path.insert(0, str(REPO / "plugins"))
    from lucid_airflow.web import create_lucid_app

    pages = TestClient(create_lucid_app(lambda: store.url, lambda: tmp_path / "reports", protect=False))
    for path in ["/", "/queue", "/running", "/models", "/tuner", "/drift", *[f"/jobs/{j}" for j in jobs]]:
        response = pages.get(path)
        assert response.status_code == 200, (path, response.text[:300])
        texts.append(response.text)
    from lucid_core.cli import main

    for argv in (["queue"], ["hosts", "list"], *[["status", j] for j in jobs], ["explain", jobs[1]]):
        main([*argv, "--store", store.url])
    captured = capsys.readouterr()
    texts += [captured.out, captured.err]
    blob = "\n".join(texts)
    assert jobs[0] in blob and "gone" in blob  # we really looked at the pages and rows
    password = make_url(throwaway_pg.url).password
    assert password and password in throwaway_pg.url
    for secret, what in ((password, "the database password"), (SECRET_ENV, "a job's secret env value"),
                         (_private_key_body(key), "SSH private key material")):
        assert secret not in blob, f"{what} leaked"
