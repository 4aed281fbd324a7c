"""Every `lucid` subcommand answers bad input with exit 2 and one line naming what is wrong, never a traceback."""

from __future__ import annotations

import argparse

import pytest

from lucid_core.cli import build_parser, main


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, (*path, name))


LEAVES = [" ".join(p) for p in _leaves(build_parser())]


def _bad_inputs(tmp) -> dict[str, list[str]]:
    """Per subcommand, input it must refuse: a missing file, an unknown job or host, a bad value."""
    store = ["--store", f"sqlite:///{tmp / 'lucid.db'}"]
    missing = str(tmp / "no-such-file.csv")
    a_file = tmp / "a-file"
    a_file.write_text("not a folder")
    return {
        "simulate": ["simulate", "--trace", missing, "--no-progress", "--out", str(tmp / "sim")],
        "check-trace": ["check-trace", missing],
        "make-sample": ["make-sample", "--jobs", "0", "--out", str(tmp / "sample")],
        "models train-packing": ["models", "train-packing", "--catalog", str(tmp / "no-catalog")],
        "models train-throughput": ["models", "train-throughput", "--series", missing],
        "models train-duration": ["models", "train-duration", "--trace", missing],
        "models eval": ["models", "eval", "duration", "--registry", str(tmp / "registry"), "--data", missing],
        "models list": ["models", "list", "--registry", str(a_file / "registry")],
        "models compare": ["models", "compare", "nope", "1", "2", "--registry", str(tmp / "registry")],
        "models promote": ["models", "promote", "nope", "7", "--registry", str(tmp / "registry")],
        "submit": ["submit", *store, "--gpus", "0", "--vc", "default", "--", "true"],
        "cancel": ["cancel", *store, "nope"],
        "status": ["status", *store, "nope"],
        "explain": ["explain", *store, "nope"],
        "eta": ["eta", *store, "nope"],
        "logs": ["logs", *store, "nope"],
        "queue": ["queue", "--store", "postgresql://nobody@127.0.0.1:1/none"],  # read by psycopg2 alone
        "history": ["history", *store, "--since", "yesterday"],
        "hosts add": ["hosts", "add", "gpu-a", *store, "--address", "gpu-a.invalid", "--known-hosts",
                      str(tmp / "known_hosts")],
        "hosts list": ["hosts", "list", "--store", "postgresql+psycopg2://nobody@127.0.0.1:1/none"],
        "hosts drain": ["hosts", "drain", *store, "nope"],
        "hosts remove": ["hosts", "remove", *store, "nope"],
        "hosts check": ["hosts", "check", *store, "nope"],
        "metrics": ["metrics", "--store", "nosuchdialect://x"],
        "round": ["round", *store, "--config", str(tmp / "missing.toml")],
        "calibrate": ["calibrate", "--host", "local", "--workloads", "nosuchmodel:32", "--out", str(tmp / "cal")],
        "tune": ["tune", "--trace", missing, "--out", str(tmp / "tune")],
    }


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refusals exit from inside main
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_every_subcommand_has_a_bad_input_case(tmp_path):
    assert sorted(_bad_inputs(tmp_path)) == sorted(LEAVES), "a new subcommand needs a bad-input case here"


@pytest.mark.parametrize("command", LEAVES)
def test_bad_input_exits_2_with_one_line(command, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    code, out, err = _run(_bad_inputs(tmp_path)[command], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (command, code, out[-500:], err[-2000:])
    assert "Traceback" not in err and len(lines) == 1, (command, err[-2000:])
    assert "error" in lines[0], lines


@pytest.mark.parametrize("command", LEAVES)
def test_an_unknown_flag_is_named(command, capsys):
    argv = [*command.split(), "--no-such-flag", "1"]
    code, _, err = _run(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "unknown option --no-such-flag" in lines[0], (command, err)
    assert lines[0].startswith(f"lucid {command}: "), lines[0]


def test_unknown_flag_is_named_before_the_missing_ones(capsys):
    code, _, err = _run(["submit", "--num-gpus", "2", "--vc", "x"], capsys)
    assert code == 2 and err.strip() == ("lucid submit: error: unknown option --num-gpus (did you mean --gpus?); "
                                         "see lucid submit --help")


@pytest.mark.parametrize("trace", ["sample", "missing"])
def test_simulate_refuses_an_out_that_is_a_file_before_reading_the_trace(trace, tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("kept")
    argv = ["simulate", "--policy", "fifo", "--no-progress", "--out", str(a_file)]
    if trace == "missing":  # the trace is never opened: the --out problem is the one named
        argv += ["--trace", str(tmp_path / "no-trace.csv")]
    code, out, err = _run(argv, capsys)
    assert code == 2 and err.strip() == f"lucid simulate: error: --out: {a_file} is a file, not a folder", err
    assert "simulating" not in out and a_file.read_text() == "kept"


def test_simulate_refuses_an_out_inside_a_file(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("kept")
    code, out, err = _run(["simulate", "--policy", "fifo", "--no-progress", "--out", str(a_file / "sub")], capsys)
    assert code == 2 and err.strip() == (f"lucid simulate: error: --out: cannot create folder {a_file / 'sub'}: "
                                         "Not a directory"), err
    assert "simulating" not in out


@pytest.mark.parametrize(("fmt", "flag"), [
    ("pollux", ["--start", "2017-10-01"]), ("pollux", ["--end", "2017-10-02"]),
    ("pollux", ["--preemptible-share", "0.5"]), ("pollux", ["--vc-config", "vc.csv"]), ("pollux", ["--seed", "3"]),
    ("pollux", ["--check-invariants"]), ("philly", ["--history", "w.csv"]), ("auto", ["--profiles", "traces"]),
])
def test_simulate_refuses_a_flag_the_trace_format_ignores(fmt, flag, tmp_path, capsys):
    out = tmp_path / "sim"
    code, stdout, err = _run(["simulate", "--trace", str(tmp_path / "no-trace.csv"), "--format", fmt,
                              "--policy", "fifo", "--no-progress", "--out", str(out), *flag], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    if fmt == "pollux":
        assert lines[0] == f"lucid simulate: error: {flag[0]} does not apply to --format pollux (its workloads " \
                           "ignore it); leave it out"
    else:
        assert lines[0] == f"lucid simulate: error: {flag[0]} applies to --format pollux only, not to --format " \
                           f"{fmt}; leave it out"
    assert not out.exists() and stdout == ""


def test_simulate_accepts_a_format_flag_left_at_its_default():
    from lucid_core.cli import check_format_flags

    args = build_parser().parse_args(["simulate", "--format", "pollux", "--seed", "0"])
    check_format_flags(args)  # --seed 0 is the default: nothing the user changed is ignored
    args = build_parser().parse_args(["simulate", "--format", "pollux", "--seed", "1"])
    with pytest.raises(ValueError, match="--seed does not apply"):
        check_format_flags(args)
