"""What every `lucid` live-scheduler command reads from its arguments (the store, the config, the executor)
and how it prints its answer (text, or JSON with --json). The options themselves: `runtime.cli`."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from lucid_core.config import LucidConfig, load_live_config

if TYPE_CHECKING:
    from lucid_core.runtime.hosts.executor import HostExecutor
    from lucid_core.runtime.store.store import Store


def store_of(args: argparse.Namespace) -> Store:
    """The store of --store (default: LUCID_STORE_URL, else SQLite in LUCID_HOME)."""
    from lucid_core.runtime.store.store import open_store

    return open_store(args.store_url)


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


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print the answer: `text`, or `data` as JSON with --json."""
    print(json.dumps(data, indent=2, default=str) if args.as_json else text)
