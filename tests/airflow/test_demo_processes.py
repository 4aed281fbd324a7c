"""The demo as a real process: it listens on 127.0.0.1 only, and SIGINT (Ctrl-C), SIGTERM (kill) or SIGHUP (a
closed terminal) stops everything it started: Airflow's components, their task processes and workers,
Lucid's job processes and telemetry agents, and its SMTP sink, so that nothing of its process tree is left
and nothing listens on its port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
MARKER_ENV = "LUCID_DEMO_MARKER"  # scripts/demo.py puts <home>#<its pid> in everything it starts


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _api_answers(port: int) -> bool:
    """Any HTTP answer from the API server on 127.0.0.1 (an auth error is an answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _listening_on(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on `port`, any process."""
    return {c.laddr.ip for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}


def _marked(marker: str) -> list[psutil.Process]:
    """Live processes whose environment holds MARKER_ENV=`marker`."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARKER_ENV) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _tree(pid: int, marker: str) -> dict[int, psutil.Process]:
    """The demo's descendants plus every process carrying its marker (Lucid's jobs leave the tree: setsid)."""
    procs = {p.pid: p for p in psutil.Process(pid).children(recursive=True)}
    procs.update({p.pid: p for p in _marked(marker)})
    return procs


def _lucid_jobs(pid: int, marker: str) -> list[int]:
    """Lucid's job wrappers and telemetry agents in the demo's tree (each in a session of its own: setsid)."""
    found = []
    for p in _tree(pid, marker).values():
        try:
            if any("run.sh" in part or "lucid_telemetry" in part for part in p.cmdline()):
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _listening_addresses(procs: dict[int, psutil.Process]) -> set[str]:
    addresses = set()
    for proc in procs.values():
        try:
            addresses |= {c.laddr.ip for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return addresses


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=lambda s: signal.Signals(s).name)
def test_a_stop_signal_leaves_no_process_and_no_listener(tmp_path, signum):
    home = (tmp_path / "demo").resolve()
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}  # the demo sets its own
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    output = tmp_path / "demo.out"
    with output.open("w") as out:
        demo = subprocess.Popen([sys.executable, str(REPO / "scripts" / "demo.py"), "--home", str(home),
                                 "--port", str(port), "--jobs", "2", "--keep-running", "--stop-grace", "5"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    marker = f"{home}#{demo.pid}"
    seen: set[str] = set()  # every address the port was seen listening on, from start to stop
    started = time.monotonic()
    try:
        while not (_api_answers(port) and "[demo] submitted" in output.read_text()):
            seen |= _listening_on(port)
            assert demo.poll() is None, output.read_text()[-3000:]
            assert time.monotonic() - started < 240, output.read_text()[-3000:]
            time.sleep(0.5)
        up_s = time.monotonic() - started
        # wait (a while) for a Lucid job or telemetry agent: they leave Airflow's sessions (setsid)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _lucid_jobs(demo.pid, marker):
            seen |= _listening_on(port)
            time.sleep(1)
        tree = _tree(demo.pid, marker) | {demo.pid: psutil.Process(demo.pid)}  # the SMTP sink is a thread of it
        jobs = len(_lucid_jobs(demo.pid, marker))
        seen |= _listening_on(port)
        listening = _listening_addresses(tree)
        assert len(tree) >= 4, tree  # the scheduler, DAG processor, triggerer and API server at least
        signalled = time.monotonic()
        if signum == signal.SIGTERM:
            os.kill(demo.pid, signum)  # `kill PID`
        else:
            os.killpg(demo.pid, signum)  # Ctrl-C and a closed terminal signal the foreground process group
        code = demo.wait(timeout=120)
        stop_s = time.monotonic() - signalled
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        for leftover in _marked(marker):  # never leak a demo into the rest of the suite
            leftover.kill()
    text = output.read_text()
    assert code == 128 + signum, text[-3000:]
    left = [p for p in tree.values() if _alive(p)] + _marked(marker)
    assert not left, [(p.pid, p.cmdline()) for p in left if _alive(p)]
    assert not _listening_on(port)
    assert seen == {"127.0.0.1"}, seen  # never 0.0.0.0 (or ::)
    assert listening == {"127.0.0.1"}, listening  # nothing of the tree (log servers, SMTP sink) on all interfaces
    assert "[demo] stopped" in text
    print(f"{signal.Signals(signum).name}: up after {up_s:.0f} s, {len(tree)} processes ({jobs} of Lucid's jobs), "
          f"stopped in {stop_s:.1f} s, {time.monotonic() - started:.0f} s in all")
