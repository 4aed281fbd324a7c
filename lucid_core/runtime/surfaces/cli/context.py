"""What every `lucid` live-scheduler command reads from its arguments (the store, the config, the executor)
and how it prints its answer (text, or JSON with --json). The options themselves: `runtime.cli`."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from lucid_core.config import LucidConfig, load_live_config

if TYPE_CHECKING:
    from lucid_core.runtime.hosts.executor import HostExecutor
    from lucid_core.runtime.store.plain_read import PlainReader
    from lucid_core.runtime.store.store import Store

Answer = TypeVar("Answer")


def store_of(args: argparse.Namespace) -> Store:
    """The store of --store (default: LUCID_STORE_URL, else SQLite in LUCID_HOME). Opening a SQLite file that
    does not exist creates it: noted in `args.new_store` for `lucid_core.cli.main` to say (`new_store_note`),
    since a forgotten LUCID_HOME otherwise reads as an empty cluster."""
    from lucid_core.runtime.store.store import default_store_url, open_store

    url = args.store_url or default_store_url()
    new = new_sqlite_file(url)
    store = open_store(url)
    if new is not None:
        args.new_store = new
    return store


def read_store(args: argparse.Namespace, plain: Callable[[PlainReader], Answer],
               full: Callable[[Store], Answer]) -> Answer:
    """A read-only answer: `plain` on a plain read of the store (`plain_read`: no SQLAlchemy, a tenth of the
    time) when it is an existing store at the packaged schema, else `full` on the opened (and migrated) store."""
    from lucid_core.runtime.store.location import default_store_url
    from lucid_core.runtime.store.plain_read import open_plain_reader

    reader = open_plain_reader(args.store_url or default_store_url())
    if reader is None:
        return full(store_of(args))
    with reader:
        return plain(reader)


def new_store_note(args: argparse.Namespace) -> str | None:
    """What `main` says when the command created a new store (None when it opened an existing one)."""
    new = getattr(args, "new_store", None)
    return None if new is None else f"created a new store at {new} (set LUCID_HOME or --store to use another)"


def refuse(args: argparse.Namespace, message: str) -> int:
    """Say a refusal in one line, with `new_store_note` when there is one (as `main` says a raised error),
    and return the exit code 2."""
    note = new_store_note(args)
    args.new_store = None  # said here: `main` says it no more
    print(message + (f"; {note}" if note else ""), file=sys.stderr)
    return 2


def new_sqlite_file(url: str) -> Path | None:
    """The file a SQLite store URL names when it does not exist yet (None: it exists, or not a SQLite file)."""
    prefix = next((p for p in ("sqlite:///", "sqlite+pysqlite:///") if url.startswith(p)), None)
    if prefix is None:
        return None
    name = url[len(prefix):].split("?", 1)[0]
    if not name or name.startswith(":memory:") or name.startswith("file:"):
        return None
    path = Path(name).expanduser()
    return None if path.exists() else path.absolute()


def config_of(args: argparse.Namespace) -> LucidConfig:
    """The live config of --config (default: LUCID_CONFIG, else LUCID_HOME/lucid.toml) with the --set knobs."""
    return load_live_config(args.config, args.set)


def executor_of(args: argparse.Namespace, deadline_s: float | None = None) -> HostExecutor:
    """The SSH (and local) executor; `deadline_s` bounds each host call (the round's host_call_deadline_s)."""
    from lucid_core.runtime.hosts.ssh_executor import ssh_executor

    if deadline_s is None:
        return ssh_executor(getattr(args, "known_hosts", None))
    return ssh_executor(getattr(args, "known_hosts", None), timeout_s=deadline_s,
                        connect_timeout_s=min(10.0, deadline_s))


def warns_when_rounds_stall(command: Callable[[argparse.Namespace], int], name: str
                            ) -> Callable[[argparse.Namespace], int]:
    """`command`, then a warning on stderr when jobs wait or run but the scheduler's rounds have stalled
    (`round_age`): what it showed may be out of date (a job RUNNING that ended) and nothing starts until they
    resume."""
    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        from lucid_core.runtime.surfaces.round_age import plain_stalled_note, stalled_note

        code = command(args)
        note = read_store(args, plain_stalled_note, stalled_note)
        if note:
            print(f"lucid {name}: warning: {note}", file=sys.stderr)
        return code

    return run


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print the answer: `text`, or `data` as JSON with --json."""
    print(json.dumps(data, indent=2, default=str) if args.as_json else text)
