"""A fleet of named hosts for the simulator: the live inventory's hosts, GPUs, VCs and profiling pool.

`lucid simulate` models a cluster as N identical nodes; the System Tuner instead replays history on
the fleet the user has, so a setting it proposes was tried on the hosts it will run on. `Fleet`
is a plain record (JSON-able, so an Airflow sweep hands one snapshot to every mapped task) and
`simulate_on_fleet` runs one policy on it through the engine's start-state entry point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lucid_core.config import LucidConfig
from lucid_core.domain import SharingKey
from lucid_core.sim.records import TraceRecord

PROFILING = "profiling"


@dataclass(frozen=True)
class FleetHost:
    """One host as the simulator sees it: its GPU count, pool and virtual cluster."""

    name: str
    gpus: int
    pool: str = "main"
    vc: str = "default"
    gpu_memory_mb: float | None = None
    gpu_model: str | None = None  # with `sharing`, the key of the catalog and packing model it runs by
    sharing: str = "time-slice"

    @property
    def sharing_key(self) -> SharingKey | None:
        return SharingKey(self.gpu_model, self.sharing) if self.gpu_model else None


@dataclass(frozen=True)
class Fleet:
    """The hosts a replay runs on (main hosts carry their VC; profiling hosts are shared)."""

    hosts: tuple[FleetHost, ...]

    @classmethod
    def from_inventory(cls, rows: Sequence[Mapping[str, Any]]) -> Fleet:
        """From `inventory.list_hosts` rows; hosts with no GPU registered are left out."""
        hosts = tuple(FleetHost(str(r["name"]), int(r["gpus"]), str(r.get("pool") or "main"),
                                str(r.get("vc") or "default"), r.get("gpu_memory_mb"),
                                _text(r.get("gpu_model")), str(r.get("sharing") or "time-slice"))
                      for r in rows if int(r.get("gpus") or 0) > 0)
        return cls(hosts)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fleet:
        return cls(tuple(FleetHost(**dict(h)) for h in data["hosts"]))

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": [asdict(h) for h in self.hosts]}

    @property
    def main_hosts(self) -> list[FleetHost]:
        return [h for h in self.hosts if h.pool != PROFILING]

    @property
    def profiling_hosts(self) -> list[FleetHost]:
        return [h for h in self.hosts if h.pool == PROFILING]

    def vc_gpus(self) -> dict[str, int]:
        """Main GPUs per virtual cluster."""
        out: dict[str, int] = {}
        for h in self.main_hosts:
            out[h.vc] = out.get(h.vc, 0) + h.gpus
        return out

    def describe(self) -> str:
        """One line a person reads: main hosts per VC and the profiling pool."""
        parts = []
        for vc in sorted(self.vc_gpus()):
            hosts = [h for h in self.main_hosts if h.vc == vc]
            parts.append(f"VC {vc}: {_count(len(hosts), 'main host')}, {_count(sum(h.gpus for h in hosts), 'GPU')}")
        pool = self.profiling_hosts
        parts.append(f"profiling pool: {_count(len(pool), 'host')}, {_count(sum(h.gpus for h in pool), 'GPU')}"
                     if pool else "no profiling pool (jobs profiled in place)")
        return "; ".join(parts)

    def by_vc(self, records: Sequence[TraceRecord]) -> bool:
        """Whether the records' VCs are the fleet's, so each job runs on its own VC's hosts (else one pool)."""
        return bool(records) and {r.vc for r in records} <= set(self.vc_gpus())

    def fitting(self, records: Sequence[TraceRecord]) -> tuple[list[TraceRecord], list[TraceRecord]]:
        """(jobs the fleet can run, jobs wider than the GPUs their VC, or the whole fleet, has)."""
        per_vc, total = self.vc_gpus(), sum(h.gpus for h in self.main_hosts)
        by_vc = self.by_vc(records)
        kept, dropped = [], []
        for r in records:
            room = per_vc.get(r.vc, 0) if by_vc else total
            (kept if r.gpus <= room else dropped).append(r)
        return kept, dropped

    def config_for(self, config: LucidConfig) -> LucidConfig:
        """`config` with whole-node size set to the fleet's largest host (multi-host jobs take whole hosts)."""
        widest = max((h.gpus for h in self.hosts), default=config.cluster.gpus_per_node)
        return config.with_overrides({"cluster.gpus_per_node": widest})

    def view(self, config: LucidConfig, by_vc: bool, now: float = 0.0):
        """An empty `ClusterView` with one node per host (`config` from `config_for`)."""
        from lucid_core.policy.packing_models import HostSharing
        from lucid_core.policy.view import ClusterView, Pool

        view = ClusterView(config, now=now)
        for h in self.hosts:
            pool = Pool.PROFILING if h.pool == PROFILING else Pool.MAIN
            view.pool(pool).add_node(h.name, h.gpus, h.gpu_memory_mb,
                                     vc=h.vc if pool is Pool.MAIN and by_vc else "")
            view.host_sharing[h.name] = HostSharing(h.sharing_key, h.sharing)
        return view


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def simulate_on_fleet(records: Sequence[TraceRecord], policy, config: LucidConfig, fleet: Fleet, *,
                      workloads=None, speeds=None, catalogs: FleetCatalogs | None = None, seed: int = 0,
                      keep_log: bool = False):
    """Replay `records` under `policy` on `fleet` (config from `fleet.config_for`); a `SimResult`.
    With `catalogs`, each host's jobs run by the catalog of its GPU model and mechanism."""
    from lucid_core.sim.engine import simulate
    from lucid_core.sim.start import StartState

    if not fleet.main_hosts:
        raise ValueError("the fleet has no main host with GPUs: nothing could run")
    now = min((r.submit_time for r in records), default=0.0)
    view = fleet.view(config, fleet.by_vc(records), now=now)
    host_catalogs = catalogs.host_catalogs(fleet, records, seed) if catalogs is not None else None
    return simulate(records, policy, config, workloads=workloads, speeds=speeds,
                    start=StartState(view, now, ()), host_catalogs=host_catalogs, keep_log=keep_log)


@dataclass(frozen=True)
class FleetCatalogs:
    """A catalog per (GPU model, mechanism) of a fleet, and the one for hosts of any other key: each kind of
    host is simulated by what was measured on it, and pairs there only as its own tree allows."""

    by_key: Mapping[SharingKey, Any]  # SharingKey -> WorkloadCatalog
    default: Any  # WorkloadCatalog for hosts whose key has none (their profiles; they share nothing)

    def packing_models(self):
        """One tree per key, trained on that key's catalog; hosts of other keys share nothing."""
        from lucid_core.policy.packing_models import PackingModels

        return PackingModels({key: catalog.packing_tree() for key, catalog in self.by_key.items()})

    def host_catalogs(self, fleet: Fleet, records: Sequence[TraceRecord], seed: int = 0):
        """Each record's workload drawn in every catalog, and each host pointed at its key's."""
        from lucid_core.sim.engine import HostCatalogs

        catalogs: dict[Any, Any] = {None: self.default, **self.by_key}
        node_key = {h.name: (h.sharing_key if h.sharing_key in self.by_key else None) for h in fleet.hosts}
        return HostCatalogs(node_key, {k: c.assign(records, seed=seed) for k, c in catalogs.items()},
                            {k: c.colocated_speeds for k, c in catalogs.items()})


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None
