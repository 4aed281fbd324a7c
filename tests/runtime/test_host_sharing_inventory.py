"""A host's GPU model and sharing mechanism in the inventory, the key the round applies packing models by."""

from __future__ import annotations

import time

import pytest

from lucid_core.cli import main
from lucid_core.config import LucidConfig
from lucid_core.domain import ShareClass, SharingKey
from lucid_core.runtime.hosts.inventory import HostSpec, InventoryError, add_host, list_hosts
from lucid_core.runtime.round.live_models import default_policy, host_sharing
from lucid_core.runtime.round.snapshot import load_snapshot
from lucid_core.runtime.store.schema import HostRow
from lucid_core.runtime.store.store import Store, record_promotion


def test_a_second_entry_for_the_same_machine_and_work_directory_is_refused(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("gpu1-a", executor="local", gpus=2, workdir=str(tmp_path / "runs")))
    with pytest.raises(InventoryError, match=r"entry gpu1-a already reaches .* one ledger of live runs"):
        add_host(store, HostSpec("gpu1-b", executor="local", gpus=2, workdir=str(tmp_path / "runs") + "/"))
    add_host(store, HostSpec("gpu1-b", executor="local", gpus=2, workdir=str(tmp_path / "runs-b")))
    # SSH entries: the same address, port, account and work directory is the same ledger
    add_host(store, HostSpec("r1", address="10.0.0.7", user="lucid", gpus=1))
    with pytest.raises(InventoryError, match=r"already reaches 10\.0\.0\.7:22"):
        add_host(store, HostSpec("r2", address="10.0.0.7", user="lucid", gpus=1))
    add_host(store, HostSpec("r2", address="10.0.0.7", port=2222, user="lucid", gpus=1))
    assert [h["name"] for h in list_hosts(store)] == ["gpu1-a", "gpu1-b", "r1", "r2"]


def test_hosts_add_records_gpu_model_and_sharing_and_list_shows_them_under_a_header(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    assert main(["hosts", "add", "h200", "--store", url, "--executor", "local", "--gpus", "1",
                 "--gpu-model", "NVIDIA H200", "--sharing", "mps", "--workdir", str(tmp_path / "h")]) == 0
    assert main(["hosts", "add", "old", "--store", url, "--executor", "local", "--gpus", "1",
                 "--workdir", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    assert main(["hosts", "list", "--store", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:6] == ["NAME", "ADDRESS", "POOL", "VC", "GPU", "MODEL"]
    h200 = next(line for line in lines if line.startswith("h200"))
    assert "NVIDIA H200" in h200 and " mps " in h200
    assert "unknown" in next(line for line in lines if line.startswith("old"))
    with pytest.raises(SystemExit):
        main(["hosts", "add", "bad", "--store", url, "--executor", "local", "--gpus", "1", "--sharing", "mig"])


class Light:
    def classify(self, profiles):
        return [ShareClass.TINY for _ in profiles]


def test_the_round_applies_each_hosts_own_keys_model_and_nothing_to_a_key_without_one(tmp_path, monkeypatch):
    import joblib

    from lucid_core.models.packing import ARTIFACT_KEY

    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("mps0", executor="local", gpus=1, gpu_model="NVIDIA H200", sharing="mps",
                             workdir=str(tmp_path / "a")))
    add_host(store, HostSpec("a100", executor="local", gpus=1, gpu_model="NVIDIA A100-SXM4-80GB",
                             workdir=str(tmp_path / "b")))
    add_host(store, HostSpec("off", executor="local", gpus=1, gpu_model="NVIDIA H200", sharing="none",
                             workdir=str(tmp_path / "c")))
    add_host(store, HostSpec("emu", executor="local", gpus=1, telemetry="emulated", workdir=str(tmp_path / "d")))
    monkeypatch.setenv("LUCID_HOME", str(tmp_path))  # a round loads artifacts from LUCID_HOME/models only
    (tmp_path / "models").mkdir()
    joblib.dump(Light(), tmp_path / "models" / "light.joblib")
    with store.session() as s:
        record_promotion(s, SharingKey("NVIDIA H200", "mps").model_kind, "1", str(tmp_path / "models" / "light.joblib"),
                         {},
                         "test", time.time())
    policy = default_policy(LucidConfig(), load_snapshot(store, time.time()))
    models = policy.binder.packing_models
    with store.session() as s:
        rows = {r.name: r for r in s.query(HostRow)}
    assert isinstance(models.model_for(host_sharing(rows["mps0"])), Light)
    assert models.model_for(host_sharing(rows["a100"])) is None
    assert "NVIDIA A100-SXM4-80GB shared by time-slice" in models.why_not(host_sharing(rows["a100"]))
    assert models.model_for(host_sharing(rows["off"])) is None
    assert models.model_for(host_sharing(rows["emu"])) is models.emulated  # no GPU: the emulation's rule
    assert ARTIFACT_KEY in models.models  # the shipped tree, for the GPUs its catalog was measured on
    assert "nvidia-h200:mps promoted version 1" in policy.model_sources["packing"]
