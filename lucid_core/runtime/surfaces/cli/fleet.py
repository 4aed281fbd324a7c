"""`lucid` fleet commands: hosts (add, list, drain, remove, check) and metrics."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from lucid_core.runtime.surfaces.cli.context import emit, executor_of, refuse, store_of

if TYPE_CHECKING:
    from lucid_core.runtime.hosts.inventory import Stranded


def cmd_hosts(args: argparse.Namespace) -> int:
    from lucid_core.runtime.hosts.inventory import (
        HostSpec,
        InventoryError,
        add_host,
        drain_host,
        list_hosts,
        remove_host,
        stranded_without,
    )
    from lucid_core.runtime.store.lease import Fenced, LeaseHeld

    store = store_of(args)
    try:
        if args.hosts_cmd == "add":
            spec = HostSpec(args.name, address=args.address, port=args.port, user=args.user or "",
                            key_path=args.key, vc=args.vc, pool=args.pool, executor=args.executor,
                            telemetry=args.telemetry, workdir=args.workdir or _default_workdir(args),
                            python=args.python, gpus=args.gpus,
                            gpu_memory_mb=args.gpu_memory_mb, run_as=args.run_as,
                            sharing=args.sharing, gpu_model=args.gpu_model)
            gpus = add_host(store, spec, None if args.gpus else executor_of(args))
            emit(args, {"name": args.name, "gpus": len(gpus)}, f"added {args.name} with {len(gpus)} GPU(s)")
            if args.key and args.executor == "ssh" and not os.access(os.path.expanduser(args.key), os.R_OK):
                # rounds read the key where they run (an Airflow worker may hold it): said, not refused
                print(f"lucid hosts add: warning: key file {args.key} cannot be read here; rounds that run on "
                      "this machine cannot reach the host (lucid hosts check)", file=sys.stderr)
        elif args.hosts_cmd == "list":
            rows = list_hosts(store)
            lines = [f"{h['name']:<12} {'local' if h['executor'] == 'local' else h['address']:<22} {h['pool']:<9} "
                     f"{h['vc']:<10} "
                     f"{(h['gpu_model'] or 'unknown')[:20]:<20} {h['sharing']:<10} {h['busy_gpus']}/{h['gpus']}"
                     f"{' jobs run as their user' if h['run_as'] == 'submitter' else ''}"
                     f"{' draining' if h['draining'] else ''}{'' if h['reachable'] else ' UNREACHABLE'}"
                     for h in rows]
            header = f"{'NAME':<12} {'ADDRESS':<22} {'POOL':<9} {'VC':<10} {'GPU MODEL':<20} {'SHARING':<10} BUSY"
            text = "\n".join([header, *lines]) if lines else ""
            emit(args, rows, text or "no hosts")
        elif args.hosts_cmd == "drain":
            drain_host(store, args.name, not args.undo, remove=args.remove, wait_s=args.wait)
            state = ("accepting work" if args.undo else
                     "draining; a round removes it once its runs have ended" if args.remove else "draining")
            stranded = stranded_without(store, args.name) if args.remove and not args.undo else None
            emit(args, {"name": args.name, "draining": not args.undo, "remove_when_empty": args.remove,
                        "no_longer_fit": [job for job, _ in stranded.jobs] if stranded else []},
                 f"{args.name}: {state}")
            if not args.undo:
                _warn_if_last(args.name, list_hosts(store), "drain")
            _warn_stranded(args.name, stranded, "drain")
        elif args.hosts_cmd == "remove":
            before = list_hosts(store)
            stranded = stranded_without(store, args.name)
            remove_host(store, args.name, wait_s=args.wait)
            _warn_if_last(args.name, before, "remove")
            _warn_stranded(args.name, stranded, "remove")
            emit(args, {"name": args.name, "removed": True}, f"removed {args.name}")
        elif args.hosts_cmd == "check":
            from lucid_core.runtime.hosts.check import check_host

            names = args.names or [h["name"] for h in list_hosts(store)]
            executor = executor_of(args)
            try:
                reports = [check_host(store, executor, n, as_user=args.as_user) for n in names]
            finally:
                executor.close()
            emit(args, [{"host": r.host, "ok": r.ok, "checks": [vars(i) for i in r.items]} for r in reports],
                   "\n".join(r.describe() for r in reports) or "no hosts")
            return 0 if all(r.ok for r in reports) else 1
    except InventoryError as exc:
        return refuse(args, f"lucid hosts {args.hosts_cmd}: error: {exc}")
    except LeaseHeld as exc:  # not bad input: a round holds the lease for longer than --wait
        print(f"lucid hosts {args.hosts_cmd}: {exc}", file=sys.stderr)
        return 1
    except Fenced as exc:  # the change outlasted its hold on the lease and a round took it: nothing written
        print(f"lucid hosts {args.hosts_cmd}: not done, try again: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    from lucid_core.runtime.surfaces.prometheus import render

    sys.stdout.write(render(store_of(args)).decode())
    return 0


def _default_workdir(args: argparse.Namespace) -> str:
    """Where a host added without --workdir keeps its runs: ~/.lucid-runs on an SSH host (its own disk), and a
    folder of its own under LUCID_HOME for a host on this machine (two local hosts in one folder are refused)."""
    if args.executor != "local":
        return "~/.lucid-runs"
    from lucid_core.config import lucid_home

    return str((lucid_home() / "hosts" / args.name).absolute())  # a relative LUCID_HOME is this folder's


def _warn_stranded(name: str, stranded: Stranded | None, command: str) -> None:
    """Say on stderr which waiting jobs no longer fit their VC once `name` is gone: they are not failed (a host
    may be added back) but wait, their reason saying so, until the VC grows again or they are cancelled."""
    if stranded is None:
        return
    shown = ", ".join(f"{job} ({gpus} GPUs)" for job, gpus in stranded.jobs[:10])
    more = f" and {len(stranded.jobs) - 10} more" if len(stranded.jobs) > 10 else ""
    undo = f", the drain is undone (lucid hosts drain {name} --undo)" if command == "drain" else ""
    print(f"lucid hosts {command}: warning: once {name} is removed, VC {stranded.vc}'s main hosts have "
          f"{stranded.gpus_left} GPU(s): waiting job(s) {shown}{more} no longer fit; they wait until hosts are "
          f"added (lucid hosts add ... --vc {stranded.vc}){undo} or they are cancelled (lucid cancel)",
          file=sys.stderr)


def _warn_if_last(name: str, hosts: list[dict], command: str) -> None:
    """Say on stderr when `name` was the last main host of its VC taking work: that VC's jobs wait, each saying so,
    until another joins (the change is made: an operator may mean it)."""
    me = next((h for h in hosts if h["name"] == name), None)
    if me is None or me["pool"] != "main":
        return
    others = [h for h in hosts if h["name"] != name and h["pool"] == "main" and h["vc"] == me["vc"]
              and not h["draining"]]
    if not others:
        print(f"lucid hosts {command}: warning: {name} was the last main host of VC {me['vc']} taking work: its "
              f"jobs wait until another joins (lucid hosts add ... --vc {me['vc']})", file=sys.stderr)
