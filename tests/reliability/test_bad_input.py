"""Bad input, property-based (hypothesis): submissions (Python, HTTP, CLI), config files and overrides,
trace files. Every bad input gets an error naming the field; nothing is written half-way."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from lucid_core.config import ConfigError, LucidConfig, describe_knobs, load_config
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.store.schema import JobEventRow, JobRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, SubmissionError, submit
from lucid_core.sim.traces import TraceFormatError, read_trace

FIXTURE_SETTINGS = settings(max_examples=40, deadline=None,
                            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# each field: (value, definitely bad?) -- bad values are bad under any reading, good ones good under any
GOOD, BAD = False, True
FIELDS = {
    "command": [("true", GOOD), (["echo", "a b", "$x"], GOOD), ("", BAD), ("   \n", BAD), ([], BAD),
                ("x" * 65537, BAD), ("a\x00b", BAD)],
    "gpus": [(1, GOOD), (2, GOOD), (0, BAD), (-3, BAD), (1.5, BAD), (None, BAD), ("two", BAD), (10**6, BAD)],
    "user": [("alice", GOOD), ("ü名 o'neil", GOOD), ("", BAD), ("  ", BAD), ("u" * 129, BAD), (None, BAD), (5, BAD)],
    "vc": [("vc-a", GOOD), ("vc-zz", BAD), ("", BAD), ("v" * 129, BAD), (None, BAD)],
    "name": [("", GOOD), ("resnet; rm -rf /", GOOD), ("n" * 257, BAD), (3, BAD)],
    "env": [({}, GOOD), ({"A_1": "x y"}, GOOD), ({"1A": "x"}, BAD), ({"LUCID_JOB_ID": "x"}, BAD),
            ({"A": "x" * 4097}, BAD), ({"A": 5}, BAD), ({f"K{i}": "v" for i in range(65)}, BAD),
            ({"A": "a\x00"}, BAD)],
    "workload": [(None, GOOD), ("resnet18", GOOD), ("w" * 257, BAD), (7, BAD)],
}
GPUS_TOO_MANY = 10**6  # flagged only once the VC is known (capacity is per VC)


def requests() -> st.SearchStrategy[dict[str, tuple[object, bool]]]:
    return st.fixed_dictionaries({name: st.sampled_from(options) for name, options in FIELDS.items()})


def expected_fields(choice: dict[str, tuple[object, bool]]) -> tuple[set[str], set[str]]:
    """(fields that must be named, fields that may be named) for a drawn request."""
    must = {name for name, (_, bad) in choice.items() if bad}
    if choice["gpus"][0] == GPUS_TOO_MANY and choice["vc"][1]:
        must.discard("gpus")  # no VC to judge the count against
    may = set(must) | {"gpus"} if choice["gpus"][0] == GPUS_TOO_MANY else set(must)
    return must, may


def named(errors: dict[str, str]) -> set[str]:
    """The request fields an error dict names (env.KEY counts as env)."""
    return {key.split(".", 1)[0] for key in errors}


def counts(store: Store) -> tuple[int, int]:
    with store.session() as s:
        return (s.scalar(select(func.count()).select_from(JobRow)),
                s.scalar(select(func.count()).select_from(JobEventRow)))


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    store = Store(f"sqlite:///{root / 'lucid.db'}")
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", gpus=4, workdir=str(root / "m0")))
    add_host(store, HostSpec("m1", executor="local", vc="vc-b", gpus=2, workdir=str(root / "m1")))
    yield store
    store.dispose()


@FIXTURE_SETTINGS
@given(choice=requests())
def test_python_submission_names_every_bad_field_and_writes_nothing(shared_store, choice):
    before = counts(shared_store)
    request = JobRequest(**{name: value for name, (value, _) in choice.items()})
    must, may = expected_fields(choice)
    if not must and not may:
        job_id = submit(shared_store, request)
        assert counts(shared_store) == (before[0] + 1, before[1] + 1)
        with shared_store.session() as s:
            assert s.get(JobRow, job_id).user == choice["user"][0]
        return
    try:
        submit(shared_store, request)
    except SubmissionError as exc:
        assert must <= named(exc.errors) <= may, (exc.errors, must, may)
        assert all(problem.strip() for problem in exc.errors.values())
    else:
        assert not must, f"accepted a request with bad {must}"
    if must:
        assert counts(shared_store) == before


@FIXTURE_SETTINGS
@given(choice=requests())
def test_http_submission_names_every_bad_field_and_writes_nothing(shared_store, choice):
    from fastapi.testclient import TestClient

    from lucid_core.runtime.surfaces.api import create_app

    client = TestClient(create_app(shared_store.url, store=shared_store))
    body = {name: value for name, (value, _) in choice.items() if value is not None or name != "workload"}
    must, may = expected_fields(choice)
    before = counts(shared_store)
    reply = client.post("/jobs", json=body)
    if not must and not may:
        assert reply.status_code == 201, reply.text
        return
    if not must:
        assert reply.status_code in (201, 422), reply.text
        return
    assert reply.status_code == 422, (body, reply.text)
    data = reply.json()
    fields = named(data["errors"]) if "errors" in data else {
        str(item["loc"][1]) for item in data["detail"] if len(item.get("loc", ())) > 1}
    # the schema layer stops at type errors, so it may name fewer fields than the validator would
    assert fields and fields <= may | {"command", "env"}, (body, data)
    assert fields & must, (body, data, must)
    assert counts(shared_store) == before


CLI_CHOICES = {
    "gpus": [("1", GOOD), ("0", BAD), ("-2", BAD), ("1.5", BAD), ("lots", BAD), (str(10**6), BAD)],
    "user": [("alice", GOOD), ("", BAD), ("u" * 129, BAD)],
    "vc": [("vc-a", GOOD), ("nope", BAD)],
    "env": [([], GOOD), (["A=1"], GOOD), (["1A=x"], BAD), (["NOEQUALS"], BAD), (["LUCID_X=1"], BAD)],
    "command": [(["echo", "hi"], GOOD), ([], BAD), (["  "], BAD)],
}


@FIXTURE_SETTINGS
@given(choice=st.fixed_dictionaries({k: st.sampled_from(v) for k, v in CLI_CHOICES.items()}))
def test_cli_submission_names_every_bad_field_and_writes_nothing(shared_store, choice, capsys):
    from lucid_core.cli import main

    argv = ["submit", "--store", shared_store.url, "--gpus", choice["gpus"][0], "--user", choice["user"][0],
            "--vc", choice["vc"][0]]
    for item in choice["env"][0]:
        argv += ["--env", item]
    argv += ["--", *choice["command"][0]]
    before = counts(shared_store)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses what it cannot even parse
        code = exc.code
    out, err = capsys.readouterr()
    bad = {k for k, (_, is_bad) in choice.items() if is_bad}
    if not bad:
        assert code == 0 and out.strip().startswith("j"), err
        return
    assert code == 2, (argv, code, out, err)
    flags = {"gpus": "gpus", "user": "user", "vc": "vc", "env": "env", "command": "command"}
    assert any(flags[field] in err for field in bad), (argv, err)
    if choice["gpus"][0] == str(10**6) and len(bad) == 1:
        assert "more than" in err
    assert counts(shared_store) == before


def test_text_that_cannot_be_stored_is_refused_naming_the_field(shared_store):
    """Lone surrogates (a mis-decoded client) and NUL (PostgreSQL refuses it): a field error, not a crash."""
    before = counts(shared_store)
    for field in ("user", "name", "vc", "command", "workload", "env"):
        for bad in ("bad\udc80text", "nul\x00inside"):
            values = {"command": "true", "gpus": 1, "user": "u", "vc": "vc-a", "name": ""}
            values[field] = {"A": bad} if field == "env" else bad
            with pytest.raises(SubmissionError) as refused:
                submit(shared_store, JobRequest(**values))
            assert field in named(refused.value.errors), (field, bad, refused.value.errors)
    assert counts(shared_store) == before


# ------------------------------------------------------------------------------------------ config
KNOBS = [name for name, _, _ in describe_knobs()]
ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                      st.text(max_size=12), st.lists(st.integers(), max_size=2),
                      st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=150, deadline=None)
@given(key=st.one_of(st.sampled_from(KNOBS), st.text(max_size=20)), value=ANY_VALUE)
def test_config_overrides_either_apply_or_name_the_knob(key, value):
    try:
        config = LucidConfig().with_overrides({key: value})
    except ConfigError as exc:
        section, _, knob = key.partition(".")
        assert (key in str(exc) or repr(section) in str(exc) or repr(key) in str(exc)
                or f"{section}.{knob}" in str(exc)), (key, value, str(exc))
        return
    section, _, knob = key.partition(".")
    applied = getattr(getattr(config, section), knob)
    if isinstance(applied, float):
        assert not math.isnan(applied)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                         st.sampled_from([b"[profiler]\ntprof_s = -1\n", b"[profiler]\ntprof_s = 'x'\n",
                                          b"[nope]\na = 1\n", b"profiler = 3\n", b"\xff\xfe[\x00p\x00",
                                          "[profiler]\ntprof_s = 300\n".encode("utf-16"),
                                          b"[binder]\nmedium_threshold = 99\ntiny_threshold = 1\n"])),
       suffix=st.sampled_from([".toml", ".yaml"]))
def test_config_files_load_or_raise_a_config_error_naming_the_file(tmp_path_factory, content, suffix):
    path = tmp_path_factory.mktemp("cfg") / f"lucid{suffix}"
    path.write_bytes(content)
    try:
        load_config(path, env={})
    except ConfigError as exc:
        message = str(exc)
        assert str(path) in message or any(k.split(".")[0] in message for k in KNOBS), message


@settings(max_examples=60, deadline=None)
@given(knob=st.sampled_from(KNOBS), value=st.text(max_size=10))
def test_config_environment_overrides_name_the_variable_or_knob(knob, value):
    section, name = knob.split(".")
    variable = f"LUCID__{section.upper()}__{name.upper()}"
    assume("\x00" not in value)
    try:
        load_config(None, env={variable: value})
    except ConfigError as exc:
        assert knob in str(exc) or variable in str(exc), str(exc)


# ------------------------------------------------------------------------------------------ traces
VALID = st.fixed_dictionaries({
    "submit_time": st.integers(0, 10**6).map(str),
    "duration": st.floats(1, 10**5).map(lambda d: f"{d:.3f}"),
    "gpus": st.integers(1, 64).map(str),
    "user": st.sampled_from(["alice", "bob", "zoë"]),
})
BAD_CELLS = st.sampled_from([
    ("duration", "-5"), ("duration", "abc"), ("duration", "inf"), ("duration", "1e400"), ("duration", ""),
    ("duration", "99999999999"), ("gpus", "0"), ("gpus", "1.5"), ("gpus", "99999"), ("gpus", "x"),
    ("gpus", "nan"), ("submit_time", "yesterday"), ("submit_time", ""), ("submit_time", "1e300"),
    ("user", "caf\udce9"),  # a latin-1 byte in a UTF-8 file
])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.one_of(VALID.map(lambda r: ("ok", r)), st.tuples(st.just("bad"), VALID, BAD_CELLS),
                               st.tuples(st.just("extra"), VALID)), min_size=1, max_size=30))
def test_trace_reader_keeps_exactly_the_valid_rows_sorted_and_reports_each_bad_line(tmp_path_factory, rows):
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["job_id", "submit_time", "duration", "gpus", "user"])
    good, bad_lines = {}, {}
    for line, row in enumerate(rows, start=2):
        job_id = f"j{line}"
        if row[0] == "ok":
            cells = row[1]
            good[job_id] = cells
        elif row[0] == "bad":
            cells = {**row[1], row[2][0]: row[2][1]}
            bad_lines[line] = row[2][0]
        else:
            cells = row[1]
            bad_lines[line] = "*"
        values = [job_id, cells["submit_time"], cells["duration"], cells["gpus"], cells["user"]]
        writer.writerow(values + (["surplus"] if row[0] == "extra" else []))
    path = tmp_path_factory.mktemp("trace") / "trace.csv"
    path.write_bytes(buffer.getvalue().encode("utf-8", "surrogateescape"))
    if not good:
        with pytest.raises(TraceFormatError, match="no valid"):
            read_trace(path, fmt="generic")
        return
    trace = read_trace(path, fmt="generic")
    assert {r.job_id for r in trace.records} == set(good)
    assert {p.row: p.column for p in trace.problems} == bad_lines
    times = [r.submit_time for r in trace.records]
    assert times == sorted(times) and times[0] == 0.0  # out-of-order input comes out in time order
    for record in trace.records:
        assert record.gpus == int(good[record.job_id]["gpus"]) and record.duration > 0


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "cp037"])
def test_a_trace_in_a_wrong_encoding_is_refused_with_a_clear_error(tmp_path, encoding):
    path = tmp_path / "trace.csv"
    path.write_bytes("submit_time,duration,gpus\n0,10,1\n5,20,2\n".encode(encoding))
    with pytest.raises(TraceFormatError) as refused:
        read_trace(path, fmt="generic")
    assert str(path) in str(refused.value) and "submit_time" in str(refused.value)


def test_a_trace_with_huge_and_absurd_values_keeps_the_sane_rows(tmp_path):
    path = tmp_path / "trace.csv"
    lines = ["submit_time,duration,gpus", "0,10,1", f"1,{'9' * 400},1", "2,10," + "9" * 50, "3,1e308,1",
             f"{'9' * 30},10,1", "4," + "1" * 200_000 + ",1", "5,10,2"]
    path.write_text("\n".join(lines) + "\n")
    trace = read_trace(path, fmt="generic")
    assert [r.submit_time for r in trace.records] == [0.0, 5.0]
    assert sorted(p.row for p in trace.problems) == [3, 4, 5, 6, 7]
    assert all(p.column in {"duration", "gpus", "submit_time", "*"} for p in trace.problems)
    json.dumps([str(p) for p in trace.problems])  # every problem prints
    assert Path(trace.source) == path


# ------------------------------------------------------------------------------------------ concurrency
@pytest.mark.postgres
def test_concurrent_submissions_on_postgresql_all_get_distinct_ids(pg_url):
    """A burst of submitters must not exhaust the job-id retries (seen as HTTP 500 in bench_load.py)."""
    from concurrent.futures import ThreadPoolExecutor

    import sqlalchemy as sa

    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP SCHEMA public CASCADE"))
        conn.execute(sa.text("CREATE SCHEMA public"))
    engine.dispose()
    store = Store(pg_url)
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", gpus=4, workdir="/tmp/unused"))
    with ThreadPoolExecutor(32) as pool:
        outcomes = list(pool.map(lambda i: _try_submit(store, i), range(640)))
    failures = [o for o in outcomes if not o.startswith("j")]
    assert not failures, f"{len(failures)} of 640 concurrent submissions failed, e.g. {failures[0]}"
    assert len(set(outcomes)) == 640 and counts(store)[0] == 640
    store.dispose()


def _try_submit(store: Store, i: int) -> str:
    try:
        return submit(store, JobRequest(f"echo {i}", 1, "u", "vc-a"))
    except Exception as exc:  # what the HTTP layer would turn into a 500
        return f"{type(exc).__name__}: {exc}"
