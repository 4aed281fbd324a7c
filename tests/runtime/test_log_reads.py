"""`lucid logs` reads a job's log by byte offset: `-f` loses nothing however much arrives between two reads, `-n N`
gives N lines of a long log, `--all` the whole log byte for byte, a character cut by a chunk's end decodes whole;
on a local host and over real sshd."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from runtime_helpers import fast_config, one_round

from lucid_core.cli import main
from lucid_core.runtime.hosts.executor import FileBytes, HostAddress
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, submit

REPO = Path(__file__).resolve().parents[2]
BURSTS, BURST_LINES = 4, 15000  # about 1.6 MB a burst, all at once: more than a MiB between two reads


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def local(tmp_path, monkeypatch):
    """A store with one local main host (no profiling: a job starts at once) and its `lucid round` arguments."""
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    config = tmp_path / "lucid.toml"
    config.write_text("[profiler]\nenabled = false\n")
    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    store = Store(url)
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=2, workdir=str(tmp_path / "m0")))
    store.dispose()
    return url, ("round", "--store", url, "--config", str(config))


def _bursts(root: Path) -> tuple[str, Path, bytes]:
    """A job that says `ready`, waits for its gate, then writes BURSTS bursts of BURST_LINES lines a second apart
    (each line with a two-byte character); its command, its gate, and the whole log it writes."""
    gate = root / f"gate-{time.monotonic_ns()}"
    script = root / f"bursts-{time.monotonic_ns()}.sh"
    script.write_text(f"echo ready\nuntil [ -e {gate} ]; do sleep 0.05; done\n"
                      f"for k in $(seq 0 {BURSTS - 1}); do\n"
                      f"  awk -v k=$k 'BEGIN {{ for (i = k * {BURST_LINES} + 1; i <= (k + 1) * {BURST_LINES}; i++) "
                      f"printf \"line %06d \\303\\251 %s\\n\", i, \"{'x' * 90}\" }}'\n"
                      "  sleep 1\ndone\n")
    expected = "ready\n" + "".join(f"line {i:06d} é {'x' * 90}\n" for i in range(1, BURSTS * BURST_LINES + 1))
    return f"sh {script}", gate, expected.encode()


def _follow(job: str, cli_args: list[str], gate: Path, run_round: Callable[[], str], root: Path) -> tuple[bytes, str]:
    """`lucid logs JOB -f` in its own process while rounds run; the gate is opened once it printed `ready`."""
    out_path, err_path = root / f"{job}.follow.out", root / f"{job}.follow.err"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        follow = subprocess.Popen([sys.executable, "-m", "lucid_core.cli", "logs", job, *cli_args, "-f",
                                   "--interval", "0.5"], stdout=out, stderr=err, env=env)
    try:
        deadline = time.monotonic() + 90
        while run_round() != "COMPLETED":
            if not gate.exists() and out_path.read_bytes().startswith(b"ready\n"):
                gate.touch()
            assert time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.3)
        assert follow.wait(timeout=60) == 0, err_path.read_text()
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    return out_path.read_bytes(), err_path.read_text()


def _across_chunks() -> bytes:
    """A 5 MB log of 100-byte lines in which a 2-, 3- and 4-byte character each straddles a 1 MiB chunk's end."""
    out = bytearray()
    n = 0
    for boundary, char in (((1 << 20), "é"), ((2 << 20), "€"), ((3 << 20), "😀"), ((5 << 20), "")):
        while len(out) + 200 < boundary:
            n += 1
            out += f"line {n:07d} {'x' * 86}\n".encode()
        if char:
            n += 1
            head = f"line {n:07d} ".encode()
            out += head + b"y" * (boundary - 1 - len(out) - len(head)) + char.encode() + b" end\n"
            assert out[boundary - 1:boundary - 1 + len(char.encode())] == char.encode()
    return bytes(out)


def _state(capsys, url: str, job: str) -> str:
    return json.loads(_cli(capsys, "status", job, "--store", url, "--json")[1])["state"]


def _local_round(capsys, url: str, round_args: tuple[str, ...], job: str) -> Callable[[], str]:
    def run() -> str:
        assert _cli(capsys, *round_args)[0] == 0
        return _state(capsys, url, job)
    return run


def test_follow_prints_every_line_once_when_megabytes_arrive_between_reads(local, capsys, tmp_path):
    """It re-read the last MiB each interval and printed what differed from the previous read: of a job writing
    3.3 MB in 15 s, the lines that fell between two windows were never printed (exit 0, nothing said)."""
    url, round_args = local
    command, gate, expected = _bursts(tmp_path)
    store = Store(url)
    job = submit(store, JobRequest(command, gpus=1, user="ana", vc="default"))
    store.dispose()
    out, err = _follow(job, ["--store", url], gate, _local_round(capsys, url, round_args, job), tmp_path)
    assert out == expected, (len(out), len(expected), err)
    assert err == ""


def _finished(capsys, url: str, round_args: tuple[str, ...], command: str) -> str:
    store = Store(url)
    job = submit(store, JobRequest(command, gpus=1, user="ana", vc="default"))
    store.dispose()
    deadline = time.monotonic() + 30
    while _local_round(capsys, url, round_args, job)() != "COMPLETED":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    return job


def test_n_gives_n_lines_all_gives_the_whole_log_and_a_character_across_chunks_is_whole(local, capsys, tmp_path,
                                                                                       monkeypatch):
    """`-n 5000` printed 704 lines (a fixed 64 KiB read); a whole log could not be read at all."""
    url, round_args = local
    content = _across_chunks()
    (tmp_path / "log.bin").write_bytes(content)
    job = _finished(capsys, url, round_args, f"cat {tmp_path / 'log.bin'}")
    text = content.decode()
    lines = text.splitlines(keepends=True)
    code, out, err = _cli(capsys, "logs", job, "--store", url, "-n", "5000")
    assert (code, out, err) == (0, "".join(lines[-5000:]), "")
    code, out, err = _cli(capsys, "logs", job, "--store", url, "--all")
    assert (code, out.encode(), err) == (0, content, "")
    code, out, err = _cli(capsys, "logs", job, "--store", url, "-n", f"+{len(lines) - 2}")  # tail's from line K
    assert (code, out, err) == (0, "".join(lines[-3:]), "")
    code, out, err = _cli(capsys, "logs", job, "--store", url, "-f")  # an ended job's long log: its end, said so
    assert code == 0 and text.endswith(out) and out.startswith("line ") and "--all" in err
    from lucid_core.runtime.surfaces.cli import logs as cli_logs

    monkeypatch.setattr(cli_logs, "LINES_SEARCH_BYTES", 1 << 20)  # the bound of -n: what lies in it, and said so
    code, out, err = _cli(capsys, "logs", job, "--store", url, "-n", "20000")
    assert code == 0 and text.endswith(out) and out.startswith("line ") and 9000 < out.count("\n") < 20000
    assert f"lucid logs {job} --all" in err and "1 MiB" in err


def test_a_truncated_log_is_said_and_followed_from_its_start(tmp_path, capsys):
    """The offset of a follow past a file that shrank would read nothing ever again: it starts over, and says so."""
    from lucid_core.runtime.surfaces.cli import logs as cli_logs

    run = tmp_path / "w" / "r1"
    run.mkdir(parents=True)
    log = run / "stdout.log"
    log.write_bytes(b"first \xc3")
    source = cli_logs.LogSource(local_executor(), HostAddress("h", executor="local", workdir=str(tmp_path / "w")),
                                "r1", "h", "stdout.log")
    printer, cursor = cli_logs._Printer(), cli_logs.Cursor()
    cli_logs._drain(source, printer, cursor)
    with log.open("ab") as f:
        f.write(b"\xa9 second\n")  # the rest of "é": decoded whole across the two reads
    cli_logs._drain(source, printer, cursor)
    log.write_bytes(b"new\n")
    cli_logs._drain(source, printer, cursor)
    out, err = capsys.readouterr()
    assert (out, cursor.offset) == ("first é second\nnew\n", 4) and "its stdout shrank from 16 bytes to 4 bytes" in err


@pytest.mark.ssh
def test_over_ssh_follow_loses_nothing_and_n_and_all_read_the_whole_log(live, capsys):
    """The same reads through the SSH executor's kept shell against real sshd: bytes come back as written."""
    store, cluster, root = live
    config = fast_config(**{"profiler.enabled": False})
    url = f"sqlite:///{root / 'lucid.db'}"
    ssh_args = ["--store", url, "--known-hosts", str(cluster.known_hosts)]
    command, gate, expected = _bursts(root)
    job = submit(store, JobRequest(command, 1, "alice", "vc-a", name="bursts"))

    def run_round() -> str:
        one_round(store, cluster, config)
        return _state(capsys, url, job)

    out, err = _follow(job, ssh_args, gate, run_round, root)
    assert out == expected and err == "", (len(out), len(expected), err)
    content = _across_chunks()
    (root / "log.bin").write_bytes(content)
    whole = submit(store, JobRequest(f"cat {root / 'log.bin'}", 1, "alice", "vc-a", name="whole"))
    deadline = time.monotonic() + 30
    while (one_round(store, cluster, config), _state(capsys, url, whole))[1] != "COMPLETED":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    code, out, err = _cli(capsys, "logs", whole, *ssh_args, "--all")
    assert (code, out.encode(), err) == (0, content, "")
    code, out, err = _cli(capsys, "logs", whole, *ssh_args, "-n", "5000")
    assert (code, out, err) == (0, "".join(content.decode().splitlines(keepends=True)[-5000:]), "")


def test_a_log_swapped_for_a_symlink_reads_as_absent(tmp_path):
    """A read by offset resolves the path as the tail read does: a job's symlink to a file outside gives nothing."""
    secret = tmp_path / "secret"
    secret.write_text("password\n")
    run = tmp_path / "w" / "r1"
    run.mkdir(parents=True)
    (run / "stdout.log").symlink_to(secret)
    (run / "stderr.log").write_bytes(b"plain\n")
    executor, host = local_executor(), HostAddress("h", executor="local", workdir=str(tmp_path / "w"))
    assert executor.read_range(host, "r1", "stdout.log", 0, 100) == FileBytes(b"", 0, None)
    assert executor.read_range(host, "r1", "stdout.log", None, 100) == FileBytes(b"", 0, None)
    assert executor.read_range(host, "r1", "stderr.log", 2, 100) == FileBytes(b"ain\n", 2, 6)
    assert executor.read_range(host, "r1", "stderr.log", None, 3) == FileBytes(b"in\n", 3, 6)


def test_a_directory_swapped_for_a_link_while_reads_run_never_sends_one_outside(tmp_path):
    """A job racing the check: a directory on the log's path flips between a real one and a link to a directory
    outside, while reads by offset and tail reads run; what was opened is checked, so no read returns the file
    outside (before, about 3% of reads did)."""
    import os
    import threading

    outside = tmp_path / "other"
    outside.mkdir()
    (outside / "f").write_bytes(b"TOP SECRET\n")
    run = tmp_path / "w" / "r1"
    (run / "real").mkdir(parents=True)
    (run / "real" / "f").write_bytes(b"job output\n")
    (run / "stdout.log").symlink_to(run / "real" / "f")
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            os.rename(run / "real", run / "kept")
            os.symlink(outside, run / "real")
            os.unlink(run / "real")
            os.rename(run / "kept", run / "real")
            stop.wait(0.003)  # real for a moment: some reads find the job's own output

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    executor, host = local_executor(), HostAddress("h", executor="local", workdir=str(tmp_path / "w"))
    try:
        seen = [executor.read_range(host, "r1", "stdout.log", 0, 100).data for _ in range(250)]
        seen += [executor.read_tail(host, "r1", "stdout.log", 100).text.encode() for _ in range(250)]
    finally:
        stop.set()
        flipper.join()
    assert not any(b"SECRET" in data for data in seen)
    assert any(data == b"job output\n" for data in seen)  # the reads worked between the flips


def test_the_marker_line_of_a_read_by_offset_is_parsed_defensively():
    """The size and the start come from the script's first line; anything else there gives no bytes, not a guess."""
    from lucid_core.runtime.hosts.reads import parse_range

    assert parse_range(b"size=12 from=3\nabc\ndef", 3, 10) == (b"abc\ndef", 3, 12)
    assert parse_range(b"size= from=0\nabc", None, 10) == (b"abc", 0, None)  # the size could not be read
    assert parse_range(b"size=12 from=9\nabc", 3, 10) == (b"", 3, 12)  # not where it was asked
    assert parse_range(b"size=12 from=\xd9\xa3\nabc", None, 10) == (b"", 0, 12)  # no ASCII digit
    assert parse_range(b"size=" + b"9" * 30 + b" from=0\nabc", 0, 10) == (b"abc", 0, None)
    assert parse_range(b"", 0, 10) == (b"", 0, None)  # absent: nothing printed
    assert parse_range(b"size=12 from=0\n" + b"x" * 20, 0, 10) == (b"x" * 10, 0, 12)


def _cut_off(host) -> None:
    """A network cut as a client sees it: the host's sshd and every connection it serves are killed (its jobs,
    started detached, run on)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    below, todo = [], list(children.get(host.process.pid, []))
    while todo:
        pid = todo.pop()
        below.append(pid)
        todo.extend(children.get(pid, []))
    host.stop()
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait_for(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.ssh
def test_a_follow_waits_for_a_host_that_stops_answering_and_prints_every_byte_once(live, capsys):
    """One failed read ended `lucid logs -f` with an error, so a network blip during a long training run ended the
    follow. It says once that the host does not answer, tries again from where it was, and loses nothing."""
    store, cluster, root = live
    config = fast_config(**{"profiler.enabled": False})
    url = f"sqlite:///{root / 'lucid.db'}"
    gate, done = root / "cut-gate", root / "cut-done"
    script = root / "cut.sh"
    script.write_text("for i in $(seq 1 100); do echo \"before $i\"; done\n"
                      f"until [ -e {gate} ]; do sleep 0.05; done\n"
                      f"for i in $(seq 1 100); do echo \"after $i\"; done\ntouch {done}\n")
    expected = "".join(f"before {i}\n" for i in range(1, 101)) + "".join(f"after {i}\n" for i in range(1, 101))
    job = submit(store, JobRequest(f"sh {script}", 1, "alice", "vc-a", name="cut"))
    out_path, err_path = root / "cut.follow.out", root / "cut.follow.err"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        follow = subprocess.Popen([sys.executable, "-m", "lucid_core.cli", "logs", job, "--store", url,
                                   "--known-hosts", str(cluster.known_hosts), "-f", "--interval", "0.3"],
                                  stdout=out, stderr=err, env=env)
    host = None
    try:
        _wait_for(lambda: (one_round(store, cluster, config), out_path.read_bytes().endswith(b"before 100\n"))[1],
                  "the follow printed the lines written before the cut")
        host = cluster.hosts[json.loads(_cli(capsys, "status", job, "--store", url, "--json")[1])["runs"][-1]["host"]]
        _cut_off(host)
        _wait_for(lambda: "no answer" in err_path.read_text(), "the follow said the host does not answer")
        gate.touch()
        _wait_for(done.exists, "the job wrote on while its host could not be reached")
        assert follow.poll() is None, err_path.read_text()  # still following
        host.start()
        host = None
        _wait_for(lambda: (one_round(store, cluster, config), _state(capsys, url, job) == "COMPLETED")[1],
                  "the job was seen completed")
        assert follow.wait(timeout=60) == 0, err_path.read_text()
    finally:
        if host is not None:
            host.start()
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    err = err_path.read_text()
    assert out_path.read_text() == expected, err
    assert err.count("no answer") == 1 and "answered again" in err and "trying again, from byte" in err, err


@pytest.mark.ssh
def test_a_follow_of_an_ended_job_whose_host_is_gone_gives_up_saying_what_was_not_read(live, capsys, monkeypatch):
    """A job that ended on a host that no longer answers: the follow tries for `ENDED_RETRY_S`, then exits 1 saying
    how much of the log it could not read and how to get it later, instead of waiting for ever."""
    from lucid_core.runtime.surfaces.cli import logs as cli_logs

    store, cluster, root = live
    config = fast_config(**{"profiler.enabled": False})
    url = f"sqlite:///{root / 'lucid.db'}"
    ssh_args = ["--store", url, "--known-hosts", str(cluster.known_hosts)]
    job = submit(store, JobRequest("echo one; echo two", 1, "alice", "vc-a", name="gone"))
    _wait_for(lambda: (one_round(store, cluster, config), _state(capsys, url, job) == "COMPLETED")[1], "completed")
    host = cluster.hosts[json.loads(_cli(capsys, "status", job, "--store", url, "--json")[1])["runs"][-1]["host"]]
    monkeypatch.setattr(cli_logs, "ENDED_RETRY_S", 1.5)
    _cut_off(host)
    try:
        started = time.monotonic()
        code, out, err = _cli(capsys, "logs", job, *ssh_args, "-f", "--all", "--interval", "0.2")
        waited = time.monotonic() - started
    finally:
        host.start()
    assert (code, out) == (1, ""), err
    assert "from byte 0, could not be read in 1.5 s" in err and f"lucid logs {job} --all" in err, err
    assert 1.5 <= waited < 30, waited
    assert _cli(capsys, "logs", job, *ssh_args, "--all")[:2] == (0, "one\ntwo\n")


class _FlakyHost:
    """In-memory run logs behind a host that can stop answering (a HostUnreachable, or a refused key, per run)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.down, self.refused = files, set(), set()
        self.back_at: float | None = None  # when the runs down answer again (None: when told)

    def read_range(self, _address, run_id, _name, offset, max_bytes):
        from lucid_core.runtime.hosts.executor import HostKeyRejected, HostUnreachable

        if run_id in self.refused:
            raise HostKeyRejected(f"host of {run_id}: its key is not the one in known_hosts")
        if run_id in self.down and (self.back_at is None or time.monotonic() < self.back_at):
            raise HostUnreachable(f"host of {run_id}: connection refused")
        data = self.files[run_id]
        start = max(0, len(data) - max_bytes) if offset is None else offset
        return FileBytes(data[start:start + max_bytes], start, len(data))


def _scripted_follow(monkeypatch, host: _FlakyHost, script: Callable[[int], None], state: dict):
    """`_follow` over `host`, `script(poll)` run at each poll of the job's state (before the reads)."""
    import argparse

    from lucid_core.runtime.surfaces import queries
    from lucid_core.runtime.surfaces.cli import logs as cli_logs

    polls = iter(range(1, 10_000))

    def status(_store, _job):
        script(next(polls))
        if isinstance(state.get("store"), BaseException):
            raise state["store"]
        return {"state": state["state"]}

    monkeypatch.setattr(queries, "status", status)
    monkeypatch.setattr(cli_logs, "_source", lambda _s, executor, _j, _stream: cli_logs.LogSource(
        executor, HostAddress(state["run"], executor="local"), state["run"], state["run"], "stdout.log"))
    monkeypatch.setattr(cli_logs, "RETRY_INTERVAL_S", 0.01)
    args = argparse.Namespace(job="j1", stderr=False, interval=0.01)
    return cli_logs._follow(args, None, host, cli_logs._Printer(), None, cli_logs.Cursor())


def test_a_follow_retries_a_log_cut_in_a_character_a_run_moved_on_and_a_job_that_ended_while_unanswered(
        monkeypatch, capsys):
    """Cases a real cut cannot time: a host down longer than ENDED_RETRY_S that comes back just after the job ended
    (the limit counted from the failure gave up at once), a UTF-8 character cut by a failed read, a new run while
    the old one's host is down (its end said unread, the new run followed), the store losing its connection."""
    from sqlalchemy.exc import InterfaceError, ProgrammingError

    from lucid_core.runtime.hosts.executor import HostKeyRejected
    from lucid_core.runtime.surfaces.cli import logs as cli_logs

    monkeypatch.setattr(cli_logs, "ENDED_RETRY_S", 0.3)
    host, state = _FlakyHost({"r1": b"caf\xc3"}), {"state": "RUNNING", "run": "r1"}

    def outage(poll: int) -> None:
        if poll == 2:
            host.down.add("r1")
        if poll == 3:
            time.sleep(0.5)  # down for longer than ENDED_RETRY_S while it runs, then it ends (its state is not
            state["state"] = "COMPLETED"  # polled again) and its host answers 0.1 s later
            host.files["r1"] += b"\xa9 ok\n"
            host.back_at = time.monotonic() + 0.1

    assert _scripted_follow(monkeypatch, host, outage, state)[1] is True
    out, err = capsys.readouterr()
    assert out == "café ok\n" and err.count("no answer") == 1 and "answered again" in err, (out, err)

    host, state = _FlakyHost({"r1": b"one\n", "r2": b"two\n"}), {"state": "RUNNING", "run": "r1"}

    def moved_on(poll: int) -> None:
        if poll == 2:
            host.files["r1"] += b"lost\n"
            host.down.add("r1")
            state["run"] = "r2"
        if poll == 3:
            state["state"] = "COMPLETED"

    assert _scripted_follow(monkeypatch, host, moved_on, state)[1] is True
    out, err = capsys.readouterr()
    assert out == "one\ntwo\n" and "the end of run r1's stdout on host r1, from byte 4, could not be read" in err

    host, state = _FlakyHost({"r1": b"x\n"}), {"state": "RUNNING", "run": "r1"}

    def store_blip(poll: int) -> None:
        state["store"] = InterfaceError("SELECT", {}, Exception("server closed the connection"),
                                        connection_invalidated=True) if poll in (2, 3) else None
        if poll == 4:
            state["state"] = "COMPLETED"

    assert _scripted_follow(monkeypatch, host, store_blip, state)[1] is True
    assert capsys.readouterr().out == "x\n"
    state = {"state": "RUNNING", "run": "r1", "store": ProgrammingError("SELECT", {}, Exception("no such column"))}
    with pytest.raises(ProgrammingError):  # a bug, not an outage: said at once
        _scripted_follow(monkeypatch, host, lambda poll: None, state)
    host.refused.add("r1")
    with pytest.raises(HostKeyRejected):
        _scripted_follow(monkeypatch, host, lambda poll: None, {"state": "RUNNING", "run": "r1"})
