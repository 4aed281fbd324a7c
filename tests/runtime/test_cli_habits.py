"""The CLI as a person uses it after a few jobs ran: history, logs, status, cancel, queue and explain."""

from __future__ import annotations

import json
import time

import pytest

from lucid_core.cli import main
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, submit


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def finished(tmp_path, capsys, monkeypatch):
    """A local main host (no profiling: jobs start at once) that ran a failing and a chatty job."""
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    config = tmp_path / "lucid.toml"
    config.write_text("[profiler]\nenabled = false\n")
    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    store = Store(url)
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=2, workdir=str(tmp_path / "m0")))
    bad = submit(store, JobRequest("echo oops >&2; exit 3", gpus=1, user="ana", vc="default", name="bad-run"))
    good = submit(store, JobRequest("for i in 1 2 3 4; do echo line $i; done", gpus=1, user="bo", vc="default",
                                    name="chatty"))
    store.dispose()
    common = ("--store", url, "--config", str(config))
    deadline = time.monotonic() + 30
    while True:
        assert _cli(capsys, "round", *common)[0] == 0
        out = _cli(capsys, "history", "--store", url, "--json")[1]
        if json.loads(out)["total"] == 2:
            break
        assert time.monotonic() < deadline, out
        time.sleep(0.3)
    return url, config, bad, good


def test_history_lists_finished_jobs_like_sacct(finished, capsys):
    url, _, bad, good = finished
    code, out, _ = _cli(capsys, "history", "--store", url)
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["JOBID", "JOBNAME", "USER", "VC", "GPUS", "STATE", "END", "ELAPSED",
                                              "EXITCODE"]
    assert any(bad in line and "FAILED" in line and line.rstrip().endswith("3") for line in lines)
    assert any(good in line and "COMPLETED" in line for line in lines)
    assert lines[-1].startswith("(1-2 of 2 finished jobs")
    code, out, _ = _cli(capsys, "history", "--store", url, "--state", "F", "--format", "JobID,User,ExitCode,Reason")
    assert code == 0 and bad in out and good not in out and "exited with code 3" in out
    code, out, _ = _cli(capsys, "history", "--store", url, "-u", "bo", "-S", "1h", "--limit", "1")
    assert code == 0 and good in out and bad not in out
    code, out, _ = _cli(capsys, "history", "--store", url, "--since", "2099-01-01")
    assert code == 0 and out.strip() == "no finished job matches"
    code, _, err = _cli(capsys, "history", "--store", url, "--format", "JobID,Colour")
    assert code == 2 and "unknown field 'Colour'" in err


def test_logs_hint_at_stderr_when_stdout_is_empty_and_take_n_and_follow(finished, capsys):
    url, _, bad, good = finished
    code, out, err = _cli(capsys, "logs", bad, "--store", url)
    assert code == 0 and out == "" and f"lucid logs {bad} --stderr" in err and "5 bytes" in err
    code, out, _ = _cli(capsys, "logs", bad, "--store", url, "--stderr")
    assert code == 0 and out == "oops\n"
    code, out, _ = _cli(capsys, "logs", good, "--store", url, "-n", "2")
    assert code == 0 and out == "line 3\nline 4\n"
    started = time.monotonic()
    code, out, _ = _cli(capsys, "logs", good, "--store", url, "-f")  # an ended job: prints all, then stops
    assert code == 0 and out.count("line") == 4 and time.monotonic() - started < 10


def test_status_cancel_queue_and_explain_speak_plainly(finished, capsys):
    url, config, bad, good = finished
    code, out, _ = _cli(capsys, "status", bad, "--store", url)
    assert code == 0 and "exit code 3" in out and "bad-run" in out
    code, out, _ = _cli(capsys, "cancel", good, "--store", url)
    assert code == 0 and out.strip() == f"{good} already ended (COMPLETED): nothing to cancel"
    store = Store(url)
    waiting = submit(store, JobRequest("sleep 30", gpus=2, user="cy", vc="default", name="wide-wait"))
    store.dispose()
    code, out, _ = _cli(capsys, "status", waiting, "--store", url)
    assert "exit code" not in out and "None" not in out
    code, out, _ = _cli(capsys, "queue", "--store", url)
    assert out.split()[:4] == ["JOB", "NAME", "USER", "VC"] and "wide-wait" in out and " cy " in out
    first = _cli(capsys, "cancel", waiting, "--store", url)[1]
    again = _cli(capsys, "cancel", waiting, "--store", url)[1]
    assert "cancel requested" in first and "cancel was already requested" in again
    code, out, _ = _cli(capsys, "explain", good, "--store", url, "--config", str(config))
    assert code == 0 and "used when placed" in out and "['" not in out, out
    assert "predicted" in out and not any(len(tok) > 8 and tok.replace(".", "").isdigit() for tok in out.split())


def test_logs_say_when_only_the_end_of_a_long_log_was_read_and_refuse_a_negative_count(finished, capsys):
    """A log longer than the 64 KiB `lucid logs` reads is shown from its first whole line, and stderr says it was
    cut (it started mid-line, silently); `-n -5` is refused (it printed nothing); a job cancelled before it ran
    says it never ran (not "has not started yet")."""
    url, config, _, _ = finished
    store = Store(url)
    long = submit(store, JobRequest("seq 20000 | sed 's/^/line number /'", gpus=1, user="ana", vc="default"))
    never = submit(store, JobRequest("true", gpus=1, user="ana", vc="default"))
    store.dispose()
    assert _cli(capsys, "cancel", never, "--store", url)[0] == 0
    deadline = time.monotonic() + 30
    while json.loads(_cli(capsys, "status", long, "--store", url, "--json")[1])["state"] != "COMPLETED":
        assert _cli(capsys, "round", "--store", url, "--config", str(config))[0] == 0
        assert time.monotonic() < deadline
        time.sleep(0.3)
    code, out, err = _cli(capsys, "logs", long, "--store", url)
    lines = out.splitlines()
    assert code == 0 and lines[-1] == "line number 20000" and 1000 < len(lines) < 20000
    assert all(line.startswith("line number ") for line in lines)  # no line cut at the front
    assert "only the last 64 KiB" in err and f"lucid logs {long} -n N" in err and "--all" in err
    code, out, err = _cli(capsys, "logs", long, "--store", url, "-n", "3")
    assert (code, out, err) == (0, "line number 19998\nline number 19999\nline number 20000\n", "")
    with pytest.raises(SystemExit) as refused:
        main(["logs", long, "--store", url, "-n", "-5"])
    assert refused.value.code == 2 and "give 0 or more" in capsys.readouterr().err
    # a short log of bytes that are no UTF-8 (each comes back as a 3-byte replacement character) is whole
    store = Store(url)
    command = "printf 'HEADER\\n'; head -c 30000 /dev/zero | tr '\\0' '\\377'; printf '\\nTAIL\\n'"
    binary = submit(store, JobRequest(command, gpus=1, user="ana", vc="default"))
    store.dispose()
    while json.loads(_cli(capsys, "status", binary, "--store", url, "--json")[1])["state"] != "COMPLETED":
        assert _cli(capsys, "round", "--store", url, "--config", str(config))[0] == 0
        assert time.monotonic() < deadline + 30
        time.sleep(0.3)
    code, out, err = _cli(capsys, "logs", binary, "--store", url)
    assert code == 0 and out.startswith("HEADER\n") and out.endswith("TAIL\n") and err == ""
    code, out, err = _cli(capsys, "logs", never, "--store", url)
    assert code == 0 and out == "" and err.startswith(f"({never} never ran: cancel")


def test_explain_of_a_job_that_ran_without_an_estimate_or_a_profile_says_so(tmp_path, capsys, monkeypatch):
    """A job placed at once (room on the main cluster, profiled in place) that ended in a second had no duration
    estimate and no profile: explain said "ordered by not ordered yet: it waits for profiling" and "not profiled
    yet" of a job long finished."""
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    for name, pool in (("p0", "profiling"), ("m0", "main")):
        assert _cli(capsys, "hosts", "add", name, "--executor", "local", "--telemetry", "emulated", "--gpus", "1",
                    "--pool", pool)[0] == 0
    job = _cli(capsys, "submit", "--gpus", "1", "--user", "ana", "--", "true")[1].strip()
    deadline = time.monotonic() + 30
    while json.loads(_cli(capsys, "status", job, "--json")[1])["state"] != "COMPLETED":
        assert _cli(capsys, "round")[0] == 0 and time.monotonic() < deadline
        time.sleep(0.3)
    code, out, _ = _cli(capsys, "explain", job)
    assert code == 0 and "never ordered by predicted GPU-time: placed before it had a duration estimate" in out
    assert "ordered by not" not in out and "not profiled yet" not in out and "never profiled" in out


def test_queue_columns_stay_aligned_with_wide_and_combining_characters_in_names(tmp_path, capsys):
    import unicodedata

    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    store = Store(url)
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=2, workdir=str(tmp_path / "m0")))
    for name in ("héllo wörld 🚀", "日本語の名前がとても長いジョブの名前", "plain", "e\u0301te\u0301"):
        submit(store, JobRequest("true", gpus=1, user="ana", vc="default", name=name))
    store.dispose()
    code, out, _ = _cli(capsys, "queue", "--store", url)

    def width(text: str) -> int:
        return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
                   for c in text)

    rows = out.splitlines()[1:]
    assert code == 0 and len(rows) == 4
    assert {width(line[: line.index(" ana ")]) for line in rows} == {35}, rows  # JOB 10 + NAME 24 + spaces
    assert any("~" in line for line in rows)  # the long name is cut, with its mark


def test_history_columns_stay_aligned_with_wide_names_and_a_nameless_job_shows_a_dash(tmp_path, capsys):
    """History aligned its columns by `len`: a CJK or emoji name pushed every column after it out, and a job
    submitted without a name showed a blank where the queue shows '-'."""
    import unicodedata

    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    store = Store(url)
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=2, workdir=str(tmp_path / "m0")))
    jobs = [submit(store, JobRequest("true", gpus=1, user="ana", vc="default", name=name))
            for name in ("héllo wörld 🚀", "日本語の名前", "plain", "")]
    store.dispose()
    for job in jobs:
        assert _cli(capsys, "cancel", job, "--store", url)[0] == 0
    assert _cli(capsys, "round", "--store", url)[0] == 0  # a round ends the cancelled jobs
    code, out, _ = _cli(capsys, "history", "--store", url, "--format", "jobid,jobname,user")

    def width(text: str) -> int:
        return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
                   for c in text)

    header, *rows = out.splitlines()[:-1]  # the last line: which page of how many
    assert code == 0 and len(rows) == 4, out
    assert {width(line[: line.index(" ana")]) for line in rows} == {width(header[: header.index(" USER")])}, out
    nameless = next(line for line in rows if line.startswith(jobs[3]))
    assert nameless.split() == [jobs[3], "-", "ana"], out


def test_logs_say_a_cut_by_the_size_on_the_host_and_keep_carriage_returns(finished, capsys):
    """Whether the 64 KiB read is the whole log was guessed from the decoded text: a long log of bytes that are no
    UTF-8 was never said to be cut. A local host's logs lost their carriage returns (a progress bar's updates
    came back as lines), and a job that wrote only to stderr was said to have written its decoded length."""
    url, config, _, _ = finished
    store = Store(url)
    long_binary = submit(store, JobRequest(
        "for i in $(seq 400); do head -c 300 /dev/zero | tr '\\0' '\\377'; echo; done; echo END",
        gpus=1, user="ana", vc="default"))
    progress = submit(store, JobRequest("printf 'step 1\\rstep 2\\rstep 3\\ndone\\n'", gpus=1, user="ana",
                                        vc="default"))
    quiet = submit(store, JobRequest("printf '\\303\\251\\303\\251' >&2", gpus=1, user="ana", vc="default"))
    store.dispose()
    deadline = time.monotonic() + 30
    while any(json.loads(_cli(capsys, "status", job, "--store", url, "--json")[1])["state"] != "COMPLETED"
              for job in (long_binary, progress, quiet)):
        assert _cli(capsys, "round", "--store", url, "--config", str(config))[0] == 0
        assert time.monotonic() < deadline
        time.sleep(0.3)
    checks: dict[str, bool] = {}
    code, out, err = _cli(capsys, "logs", quiet, "--store", url)  # "é" twice: 2 characters, 4 bytes
    checks["stderr bytes"] = code == 0 and out == "" and f"it wrote 4 bytes to stderr: lucid logs {quiet}" in err
    code, out, err = _cli(capsys, "logs", progress, "--store", url)
    checks["carriage returns"] = (code, out, err) == (0, "step 1\rstep 2\rstep 3\ndone\n", "")
    code, out, err = _cli(capsys, "logs", progress, "--store", url, "-n", "2")  # lines as `tail -n` counts them
    checks["lines of carriage returns"] = (code, out, err) == (0, "step 1\rstep 2\rstep 3\ndone\n", "")
    code, out, err = _cli(capsys, "logs", long_binary, "--store", url)
    checks["cut"] = code == 0 and out.endswith("\nEND\n") and "only the last 64 KiB" in err
    assert all(checks.values()), checks
