"""The `lucid` command line follows its ecosystem's habits (issue 38 item 6): defaults where there is one
answer, a header on every list, --set and names checked before anything runs, quiet on a closed pipe, numbers in
a job's units, a word when a new store is made, and the everyday commands start without the heavy libraries."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from lucid_core.cli import COMMANDS, build_parser, main, parser_for
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.store.schema import JobRow
from lucid_core.runtime.store.store import Store
from lucid_core.units import gpu_time_words

REPO = Path(__file__).resolve().parents[1]
LUCID = REPO / ".venv" / "bin" / "lucid"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse refusals and --help exit from inside main
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _store(tmp_path: Path, *vcs: str) -> str:
    """A SQLite store with one 2-GPU local main host per VC (each its own work directory)."""
    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    store = Store(url)
    for i, vc in enumerate(vcs):
        add_host(store, HostSpec(f"m{i}", executor="local", telemetry="emulated", gpus=2, vc=vc,
                                 workdir=str(tmp_path / f"m{i}")))
    store.dispose()
    return url


def _jobs(url: str, waiting: int = 0, ended: int = 0, predicted_s: float = 600.0) -> None:
    """Write waiting (QUEUED, with a prediction and a long reason) and ended (COMPLETED) jobs straight in."""
    now = time.time()
    rows = []
    for seq in range(1, waiting + ended + 1):
        done = seq > waiting
        rows.append({"job_id": f"j{seq:06d}", "seq": seq, "name": f"job-{seq}", "user": "ana", "vc": "a", "gpus": 1,
                     "command": "true", "env": {}, "state": "COMPLETED" if done else "QUEUED",
                     "submit_time": now - 7200 + seq, "start_time": now - 3600 + seq if done else None,
                     "end_time": now - 60 + seq if done else None, "exit_code": 0 if done else None,
                     "predicted_duration": predicted_s, "queue_position": None if done else seq,
                     "pending_reason": None if done else "no compact fit for 1 GPU(s): every GPU of VC a is busy"})
    store = Store(url)
    with store.engine.begin() as conn:
        conn.execute(sa.insert(JobRow.__table__), rows)
    store.dispose()


# --- 1. --vc defaults to the only VC; several, or an unknown one, fail at once naming them ----------------------

def test_submit_takes_the_only_vc_and_names_them_when_there_are_several(tmp_path, capsys):
    url = _store(tmp_path, "a")
    code, out, err = _cli(capsys, "submit", "--store", url, "--gpus", "1", "--", "true")
    assert code == 0 and err == "", err
    job = out.strip()
    code, out, _ = _cli(capsys, "status", job, "--store", url)
    assert code == 0 and "VC a" in out
    store = Store(url)
    add_host(store, HostSpec("m9", executor="local", telemetry="emulated", gpus=2, vc="b",
                             workdir=str(tmp_path / "m9")))
    store.dispose()
    code, out, err = _cli(capsys, "submit", "--store", url, "--gpus", "1", "--", "true")
    assert code == 2 and out == "" and _lines(err) == ["lucid submit: error: --vc is needed: this cluster has "
                                                       "2 VCs: a, b"]
    code, _, err = _cli(capsys, "submit", "--store", url, "--gpus", "1", "--vc", "nosuch", "--", "true")
    assert code == 2 and len(_lines(err)) == 1 and "unknown VC 'nosuch'; known: a, b" in err
    with Store(url).session() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(JobRow)) == 1  # neither refusal wrote a job


def test_submit_without_any_host_says_how_to_add_one(tmp_path, capsys):
    url = _store(tmp_path)
    code, _, err = _cli(capsys, "submit", "--store", url, "--gpus", "1", "--", "true")
    assert code == 2 and len(_lines(err)) == 1 and "no main host (lucid hosts add" in err


# --- 2. every list starts with its header ---------------------------------------------------------------------

def test_every_list_starts_with_a_header(tmp_path, capsys):
    from lucid_core.models.registry import ModelRegistry

    url = _store(tmp_path, "a")
    _jobs(url, waiting=2, ended=2)
    registry = tmp_path / "registry"
    ModelRegistry(registry).register("duration", {"fitted": True}, kind="test", training_window=("a", "b"),
                                     data_hash="x", metrics={"mae": 1.0})
    headers = {("queue",): ["JOB", "NAME", "USER", "VC", "STATE", "POS", "GPUS", "PRED", "PRIORITY", "REASON"],
               ("history",): ["JOBID", "JOBNAME", "USER", "VC", "GPUS", "STATE", "END", "ELAPSED", "EXITCODE"],
               ("hosts", "list"): ["NAME", "ADDRESS", "POOL", "VC", "GPU", "MODEL", "SHARING", "BUSY"]}
    for argv, header in headers.items():
        code, out, _ = _cli(capsys, *argv, "--store", url)
        assert code == 0 and out.splitlines()[0].split() == header, (argv, out)
        assert len(_lines(out)) >= 2, out  # the header heads rows
    code, out, _ = _cli(capsys, "models", "list", "--registry", str(registry))
    assert code == 0 and out.splitlines()[0].startswith("| name | version |") and "| duration | 1 |" in out


# --- 3. --set is checked against the config schema before the command does anything ---------------------------

def _leaves_with_set() -> list[tuple[str, argparse.ArgumentParser]]:
    found = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs and "--set" in parser._option_string_actions:
            found.append((" ".join(path), parser))
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, (*path, name))

    walk(build_parser(), ())
    return found


SET_LEAVES = dict(_leaves_with_set())


def _minimal_argv(leaf: str) -> list[str]:
    """The leaf's subcommand with a value for each argument it requires (the values need not make sense)."""
    argv = leaf.split()
    for action in SET_LEAVES[leaf]._actions:
        value = "1" if action.type is int else "x"
        if not action.option_strings and action.nargs in (None, 1):
            argv.append(value)
        elif action.option_strings and action.required:
            argv += [action.option_strings[0], value]
    return argv


def test_the_set_leaves_are_the_live_commands_and_the_simulators():
    assert {"simulate", "tune", "queue", "status", "history", "round", "eta", "explain", "submit",
            "hosts list"} <= set(SET_LEAVES)


@pytest.mark.parametrize("leaf", sorted(SET_LEAVES))
def test_a_bad_set_value_fails_first_naming_the_knob_and_its_range(leaf, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    code, _, err = _cli(capsys, *_minimal_argv(leaf), "--set", "profiler.tprof_s=abc")
    assert code == 2 and _lines(err) == [f"lucid {leaf.split()[0]}: error: --set profiler.tprof_s: expected a number "
                                         "(float) from 1 to 86400, got 'abc'"], err
    assert list(tmp_path.iterdir()) == [], "the command ran before its --set was checked"


@pytest.mark.parametrize(("item", "says"), [
    ("profiler.tprof_s=0", "--set profiler.tprof_s: expected a number (float) from 1 to 86400, got '0'"),
    ("profiler.nprof_gpus=2.5", "--set profiler.nprof_gpus: expected a whole number (int) from 0 to 1024, got '2.5'"),
    ("profiler.enabled=perhaps", "--set profiler.enabled: expected true or false, got 'perhaps'"),
    ("binder.sharing=maybe", "--set binder.sharing: expected one of auto, on, off, got 'maybe'"),
    ("binder.pair_priority_ratio=0.5", "--set binder.pair_priority_ratio: expected a number (float) >= 1, got '0.5'"),
    ("profiler.tprof=300", "--set profiler.tprof: unknown knob (did you mean profiler.tprof_s"),
    ("profilr.tprof_s=300", "--set profilr.tprof_s: unknown section 'profilr' (did you mean profiler?); sections: "
                            "profiler, binder, orchestrator"),
    ("tprof_s=300", "--set takes SECTION.KNOB=VALUE, got 'tprof_s=300'"),
])
def test_set_names_what_is_wrong_in_one_line(item, says, tmp_path, capsys):
    code, _, err = _cli(capsys, "queue", "--store", f"sqlite:///{tmp_path / 'never.db'}", "--set", item)
    assert code == 2 and len(_lines(err)) == 1 and f"lucid queue: error: {says}" in err, err
    assert not (tmp_path / "never.db").exists()


def test_an_unknown_knob_lists_the_sections_knobs(capsys):
    code, _, err = _cli(capsys, "history", "--set", "runtime.stop_grace=5")
    assert code == 2 and "did you mean runtime.stop_grace_s" in err
    assert "runtime knobs: lease_ttl_s, stop_grace_s" in err


def test_good_set_values_still_reach_the_command(tmp_path, capsys):
    url = _store(tmp_path, "a")
    code, _, err = _cli(capsys, "queue", "--store", url, "--set", "profiler.tprof_s=300", "--set",
                        "binder.sharing=off")
    assert code == 0 and err == ""


# --- 4. unknown names fail at once with the known ones --------------------------------------------------------

def test_simulate_refuses_an_unknown_policy_before_reading_the_trace(tmp_path, capsys):
    missing = str(tmp_path / "no-trace.csv")
    out_dir = tmp_path / "sim"
    code, _, err = _cli(capsys, "simulate", "--trace", missing, "--policy", "lucid,sfj", "--no-progress",
                        "--out", str(out_dir))
    assert code == 2 and _lines(err) == [
        "lucid simulate: error: --policy: unknown policy 'sfj' (did you mean sjf?); choose from fifo, sjf, qssf, "
        "horus, tiresias, lucid, qssf-backfill, lucid-nosharing, lucid-noprofiler, lucid-noestimator, "
        "lucid-fixedtprof"]
    code, _, err = _cli(capsys, "simulate", "--trace", missing, "--format", "pollux", "--policy", "qssf",
                        "--out", str(out_dir))
    assert code == 2 and "unknown policy 'qssf'; choose for pollux workloads from pollux, fifo" in err
    code, _, err = _cli(capsys, "simulate", "--trace", missing, "--policy", ",", "--out", str(out_dir))
    assert code == 2 and "--policy names no policy" in err
    assert not out_dir.exists()


# --- 5. a closed pipe ends the command quietly ----------------------------------------------------------------

@pytest.mark.parametrize("argv", [["queue"], ["history", "--limit", "3000"]], ids=["queue", "history"])
def test_a_closed_pipe_ends_quietly_with_exit_0(argv, tmp_path):
    url = _store(tmp_path, "a")
    _jobs(url, waiting=3000, ended=3000)  # far more than a pipe's buffer holds
    env = {k: v for k, v in os.environ.items() if not k.startswith("LUCID_")}
    proc = subprocess.Popen([str(LUCID), *argv, "--store", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()  # like `| head -1`: read a line, then go away
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err
    assert first.split()[:2] in ([b"JOB", b"NAME"], [b"JOBID", b"JOBNAME"])


def test_head_in_a_shell_pipeline_sees_exit_0_and_no_traceback(tmp_path):
    url = _store(tmp_path, "a")
    _jobs(url, waiting=3000)
    done = subprocess.run(["bash", "-c", f'"{LUCID}" queue --store "{url}" | head -1; exit "${{PIPESTATUS[0]}}"'],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "" and done.stdout.startswith("JOB"), done


# --- 6. GPU-time in the unit its size reads best in -----------------------------------------------------------

@pytest.mark.parametrize(("gpu_s", "words"), [
    (0, "0 GPU-s"), (42, "42 GPU-s"), (59.6, "1.0 GPU-min"), (90, "1.5 GPU-min"), (720, "12 GPU-min"),
    (3599, "1.0 GPU-h"), (12240, "3.4 GPU-h"), (36000, "10 GPU-h"), (432000, "120 GPU-h")])
def test_gpu_time_is_scaled_to_its_size(gpu_s, words):
    assert gpu_time_words(gpu_s) == words


def test_queue_and_explain_print_priority_in_a_jobs_units(tmp_path, capsys):
    url = _store(tmp_path, "a")
    _jobs(url, waiting=1, predicted_s=600.0)  # 1 GPU x 10 min: "0.167 GPU-h" before, "0.00 GPU-h" in places
    code, out, _ = _cli(capsys, "queue", "--store", url)
    row = out.splitlines()[1]
    assert code == 0 and "10 GPU-min" in row and "GPU-h" not in row, out  # the reason leaves priority to its column
    assert row.rstrip().endswith("no compact fit for 1 GPU(s): every GPU of VC a is busy"), row
    code, out, _ = _cli(capsys, "queue", "--store", url, "--json")  # the data keep the reason whole
    assert code == 0 and "priority" in json.loads(out)[0]["pending_reason"]
    config = tmp_path / "lucid.toml"
    config.write_text("[profiler]\nenabled = false\n")
    code, out, _ = _cli(capsys, "explain", "j000001", "--store", url, "--config", str(config))
    assert code == 0 and "priority 10 GPU-min = 1 GPU(s) x predicted 10.0 min" in out, out


# --- 7. a new store is said, once, on stderr ------------------------------------------------------------------

def test_a_new_store_is_said_on_stderr_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LUCID_STORE_URL", raising=False)
    made = tmp_path / "home" / "lucid.db"
    code, out, err = _cli(capsys, "queue")
    assert code == 0 and "no running or waiting job" in out
    assert _lines(err) == [f"lucid: created a new store at {made} (set LUCID_HOME or --store to use another)"]
    code, _, err = _cli(capsys, "queue")
    assert code == 0 and err == ""
    other = tmp_path / "other.db"
    code, _, err = _cli(capsys, "status", "j000001", "--store", f"sqlite:///{other}")  # an error says it in its line
    assert code == 2 and _lines(err) == [f"lucid status: error: no job 'j000001'; created a new store at {other} "
                                         "(set LUCID_HOME or --store to use another)"]
    code, _, err = _cli(capsys, "hosts", "drain", "nope", "--store", f"sqlite:///{tmp_path / 'third.db'}")
    assert code == 2 and len(_lines(err)) == 1 and "created a new store at" in err


# --- 8. the everyday commands import only what they need ------------------------------------------------------

HEAVY = ("pandas", "numpy", "alembic", "paramiko", "sklearn", "interpret", "matplotlib", "fastapi",
         "lucid_core.models.cli", "lucid_core.sim.traces", "lucid_core.runtime.hosts.inventory",
         "lucid_core.runtime.round.snapshot", "lucid_core.policy.orchestrator")


def _imported_by(*argv: str) -> set[str]:
    """The modules a `lucid ARGV` process had imported when it ended (its own output thrown away)."""
    code = ("import io, sys, contextlib\nfrom lucid_core.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(sys.argv[1:])\n    except SystemExit:\n        pass\n"
            "print('\\n'.join(sys.modules))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LUCID_")}
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=60,
                          check=True)
    return set(done.stdout.split())


def test_the_everyday_commands_import_no_heavy_library(tmp_path):
    url = _store(tmp_path, "a")
    _jobs(url, waiting=2, ended=2)
    helped = _imported_by("--help")
    assert "sqlalchemy" not in helped and not [m for m in HEAVY if m in helped]
    for argv in (["queue"], ["status", "j000001"], ["history"]):
        loaded = _imported_by(*argv, "--store", url)
        assert "lucid_core.runtime.surfaces.plain_views" in loaded  # it did run
        # a store at the packaged head is read without SQLAlchemy (the ORM alone took 0.3 s)
        assert [m for m in (*HEAVY, "sqlalchemy") if m in loaded] == [], argv


def test_explain_and_eta_load_no_model_library_when_no_model_is_promoted(tmp_path):
    """Naming the models root and reading the packing tree's path cost pandas and joblib (0.3-0.7 s of each
    `lucid explain` and `eta`, and of every live round) though nothing was loaded from them."""
    url = _store(tmp_path, "a")
    _jobs(url, waiting=2, ended=2)
    for argv in (["explain", "j000001"], ["eta", "j000001"]):
        loaded = _imported_by(*argv, "--store", url)
        assert "lucid_core.runtime.surfaces.explain" in loaded or "lucid_core.runtime.surfaces.eta" in loaded
        assert [m for m in ("pandas", "joblib", "sklearn", "interpret", "matplotlib") if m in loaded] == [], argv


def test_lucid_help_lists_every_subcommand_with_its_modules_help():
    def listed(parser: argparse.ArgumentParser) -> list[tuple[str, str | None]]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return [(c.dest, c.help) for c in sub._choices_actions]

    assert listed(parser_for([])) == listed(build_parser())
    assert listed(parser_for(["--help"])) == [(name, text) for name, (_, text) in COMMANDS.items()]
    for name in COMMANDS:  # each command's own parser knows it
        assert name in next(a for a in parser_for([name])._actions
                            if isinstance(a, argparse._SubParsersAction)).choices


def test_the_store_opens_at_the_head_without_alembic_knowing_the_head_alembic_knows():
    from alembic.script import ScriptDirectory

    from lucid_core.runtime.store.store import MIGRATIONS_DIR, packaged_head

    assert packaged_head() == ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def test_the_readmes_local_hosts_are_added_as_written_and_bare_hosts_lists_them(tmp_path, monkeypatch, capsys):
    """The README's "No GPU host at hand?" commands, run verbatim: both local hosts are added (they once shared
    the default work directory, and the second was refused), each in a folder of its own under LUCID_HOME; bare
    `lucid hosts` lists them as `lucid hosts list` does, and a missing or unknown subcommand names the choices."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index("No GPU host at hand?"):]
    block = block[block.index("```") + 3:]
    commands = [line.split()[1:] for line in block[: block.index("```")].splitlines() if line.startswith("lucid ")]
    assert len(commands) == 2, commands
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    for argv in commands:
        assert _cli(capsys, *argv)[0] == 0, argv
    code, bare, _ = _cli(capsys, "hosts")
    assert code == 0 and bare == _cli(capsys, "hosts", "list")[1]
    assert [line.split()[:3] for line in _lines(bare)[1:]] == [["m0", "local", "main"], ["p0", "local", "profiling"]]
    assert {h["name"] for h in json.loads(_cli(capsys, "hosts", "--json")[1])} == {"m0", "p0"}
    from lucid_core.runtime.store.schema import HostRow

    store = Store(f"sqlite:///{tmp_path / 'home' / 'lucid.db'}")
    with store.session() as s:
        workdirs = {h.name: h.workdir for h in s.scalars(sa.select(HostRow))}
    store.dispose()
    assert workdirs == {n: str(tmp_path / "home" / "hosts" / n) for n in ("m0", "p0")}
    for argv in (["hosts", "bogus"], ["models"]):
        code, _, err = _cli(capsys, *argv)
        assert code == 2 and len(_lines(err)) == 1
    assert "{add,list,drain,remove,check}" in _cli(capsys, "hosts", "bogus")[2]


def test_simulate_names_every_format_it_reads_and_refuses_a_typo(capsys):
    """`--format phily` listed the trace formats without `pollux`, which `simulate` reads too."""
    from lucid_core.cli import SIMULATE_FORMATS
    from lucid_core.sim.traces import TRACE_FORMATS

    assert ("auto", *TRACE_FORMATS, "pollux") == SIMULATE_FORMATS
    code, _, err = _cli(capsys, "simulate", "--format", "phily")
    assert code == 2 and len(_lines(err)) == 1 and "'pollux'" in err and "'philly'" in err


def test_draining_or_removing_a_vcs_last_main_host_warns(tmp_path, monkeypatch, capsys):
    """The change is made (an operator may mean it), and stderr says that VC's jobs will wait."""
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    for name, pool in (("p0", "profiling"), ("m0", "main")):
        assert _cli(capsys, "hosts", "add", name, "--executor", "local", "--gpus", "1", "--pool", pool)[0] == 0
    code, out, err = _cli(capsys, "hosts", "drain", "m0")
    assert code == 0 and out.strip() == "m0: draining"
    assert err.strip() == ("lucid hosts drain: warning: m0 was the last main host of VC default taking work: its "
                           "jobs wait until another joins (lucid hosts add ... --vc default)")
    assert _cli(capsys, "hosts", "drain", "m0", "--undo")[2] == ""
    assert _cli(capsys, "hosts", "add", "m1", "--executor", "local", "--gpus", "1")[0] == 0
    assert _cli(capsys, "hosts", "drain", "m0")[2] == "" and _cli(capsys, "hosts", "remove", "p0")[2] == ""
    code, _, err = _cli(capsys, "hosts", "remove", "m1")
    assert code == 0 and "warning: m1 was the last main host of VC default" in err  # m0 is draining


def test_simulate_draws_no_progress_bar_into_a_redirected_stderr(tmp_path):
    """Redirected, the bars' redraws filled the file with carriage-return lines."""
    trace = tmp_path / "trace.csv"  # long enough for a bar to redraw
    trace.write_text("job_id,submit_time,duration,gpus,vc,user,name\n" + "".join(
        f"j{i},{30 * i},{600 + 37 * (i % 500)},{(1, 2, 4)[i % 3]},vc1,u{i % 20},n{i}\n" for i in range(20000)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LUCID_")}
    done = subprocess.run([str(LUCID), "simulate", "--trace", str(trace), "--format", "generic", "--policy", "fifo",
                           "--nodes", "16", "--out", str(tmp_path / "sim")],
                          capture_output=True, env=env, timeout=120)  # bytes: text mode reads \r as \n
    assert done.returncode == 0, done.stderr[-2000:]
    assert b"\r" not in done.stderr and b"fifo" in done.stdout


def test_a_local_host_under_a_relative_lucid_home_gets_an_absolute_work_directory(tmp_path, monkeypatch, capsys):
    """Rounds run from other folders (a cron job, an Airflow worker): a relative folder would be another one there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LUCID_HOME", "rel")
    assert _cli(capsys, "hosts", "add", "m0", "--executor", "local", "--gpus", "1")[0] == 0
    from lucid_core.runtime.store.schema import HostRow

    store = Store(f"sqlite:///{tmp_path / 'rel' / 'lucid.db'}")
    with store.session() as s:
        assert s.get(HostRow, "m0").workdir == str(tmp_path / "rel" / "hosts" / "m0")
    store.dispose()


def test_a_value_with_a_minus_is_said_to_be_one(tmp_path, monkeypatch, capsys):
    """`--since -3d` read as an unknown option `-3d`, with a guess at `--set`."""
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    for argv, value in ((["history", "--since", "-3d"], "-3d"), (["round", "--every", "-2s"], "-2s")):
        code, _, err = _cli(capsys, *argv)
        assert code == 2 and len(_lines(err)) == 1 and f"unknown option {value} (a value with a minus" in err
        assert "did you mean" not in err
