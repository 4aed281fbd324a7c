"""Calibration journal, catalog format, labels, emulation and label comparison (no hosts, no torch)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lucid_core.calibration.catalog import (
    PAIR_COLUMNS,
    SINGLE_COLUMNS,
    catalog_sharing_key,
    sharing_label,
    write_catalog,
    write_environment,
)
from lucid_core.calibration.compare import compare_labels, comparison_markdown
from lucid_core.calibration.configs import WorkloadConfig
from lucid_core.calibration.emulation import EmulatedProfiles
from lucid_core.calibration.harness import (
    CalibrationSettings,
    CalibrationTarget,
    Trial,
    overlap_fraction,
    trial_command,
    window_samples,
)
from lucid_core.calibration.journal import JOURNAL_NAME, FailedTrial, Journal, PairRecord, RefusedPair, SoloRecord
from lucid_core.calibration.workloads.protocol import WorkloadResult
from lucid_core.domain import ShareClass
from lucid_core.models.datasets import shared_data_dir
from lucid_core.runtime.hosts.executor import HostAddress

ARTIFACT = shared_data_dir() / "lucid_artifact" / "single_data.csv"
RESNET = WorkloadConfig("resnet18", 32)
PPO = WorkloadConfig("ppo", 32)
LM = WorkloadConfig("transformer", 16, amp=True)


def _solo(config: WorkloadConfig, ips: float, util: float, mem: float) -> SoloRecord:
    return SoloRecord(config=config, iters_per_s=ips, samples_per_s=ips * config.batch_size, gpu_util=util,
                      mem_util=util / 2, gpu_mem_mb=mem, telemetry_samples=10, emulated=True, run_id="r", host="h",
                      gpu=0)


def _pair(a: WorkloadConfig, b: WorkloadConfig, sa: float, sb: float) -> PairRecord:
    return PairRecord(first=a, second=b, speed_first=sa, speed_second=sb, iters_per_s_first=1.0,
                      iters_per_s_second=1.0, gpu_util=80.0, mem_util=30.0, gpu_mem_mb=4101.6, overlap=0.97,
                      telemetry_samples=10, emulated=True, run_id="p", host="h", gpu=0)


def _journal(tmp_path: Path) -> Journal:
    journal = Journal.open(tmp_path)
    journal.append(_solo(RESNET, 55.1234, 58.66666, 2360.4))
    journal.append(_solo(PPO, 120.0, 12.4, 2051.0))
    journal.append(_solo(LM, 10.0, 90.0, 9000.0))
    journal.append(_pair(RESNET, PPO, 0.90, 1.0))  # resnet mean (0.90 + 0.85 + 0.85)/3 = 0.867 -> Medium
    journal.append(_pair(RESNET, RESNET, 0.85, 0.85))
    journal.append(_pair(PPO, PPO, 0.99, 0.97))  # ppo mean (1.0 + 0.99 + 0.97)/3 -> Tiny
    journal.append(RefusedPair(LM, LM, "does not fit"))
    return journal


def test_labels_follow_the_paper_thresholds_and_never_shared_is_jumbo() -> None:
    assert sharing_label(0.95) is ShareClass.TINY
    assert sharing_label(0.9499) is ShareClass.MEDIUM
    assert sharing_label(0.85) is ShareClass.MEDIUM
    assert sharing_label(0.8499) is ShareClass.JUMBO
    assert sharing_label(math.nan) is ShareClass.JUMBO
    assert sharing_label(0.9, tiny_threshold=0.9) is ShareClass.TINY


def test_journal_round_trips_and_survives_a_torn_last_line(tmp_path: Path) -> None:
    _journal(tmp_path)
    journal_file = tmp_path / JOURNAL_NAME
    with journal_file.open("a") as fh:
        fh.write('{"kind": "solo", "config": {"workl')  # the controller died mid-write
    again = Journal.open(tmp_path)
    assert set(again.solos) == {RESNET.key, PPO.key, LM.key}
    assert again.solos[RESNET.key] == _solo(RESNET, 55.1234, 58.66666, 2360.4)
    assert again.has_pair(PPO, RESNET) and again.has_pair(RESNET, PPO)  # order-free
    assert not again.has_pair(LM, LM) and len(again.refused) == 1
    again.append(FailedTrial((LM,), "x", 1, "boom"))
    assert Journal.open(tmp_path).failures == {f"solo-{LM.key}": 1}


def test_catalog_is_written_in_the_artifact_format(tmp_path: Path) -> None:
    files = write_catalog(_journal(tmp_path), tmp_path)
    single = files.single.read_text().splitlines()
    pairs = files.colocate.read_text().splitlines()
    assert single[0] == ",".join(SINGLE_COLUMNS)
    assert pairs[0] == ",".join(PAIR_COLUMNS) and pairs[0].startswith(",model1,dataset1,gpu_num1,")
    rows = {line.split(",")[0]: line for line in single[1:]}
    assert rows["ResNet18"] == "ResNet18,CIFAR-10-synthetic,32,0,1763.949,58.667,29.333,2360.0,1"
    assert rows["PPO"] == "PPO,LunarLander-synthetic,32,0,120.000,12.400,6.200,2051.0,0"  # env steps/s
    assert rows["TransformerLM"].endswith(",9000.0,2")  # refused everywhere: never co-located -> Jumbo
    assert len(pairs) == 1 + 3 and pairs[1].startswith("0,") and pairs[1].endswith(",80.000,30.000,4102")
    if ARTIFACT.is_file():  # same header line as the artifact's files
        assert ARTIFACT.read_text().splitlines()[0] == single[0]
        assert (ARTIFACT.parent / "colocate_info.csv").read_text().splitlines()[0] == pairs[0]


def test_packing_trainer_reads_the_catalog_and_derives_the_same_labels(tmp_path: Path) -> None:
    from lucid_core.models.packing import PackingTree, load_packing_catalog

    write_catalog(_journal(tmp_path), tmp_path)
    catalog = load_packing_catalog(tmp_path)
    assert len(catalog.profiles) == 3 and len(catalog.pairs) == 3
    derived = PackingTree().catalog_labels(catalog)
    assert list(catalog.profiles["key"].str.split("/").str[0]) == ["PPO", "ResNet18", "TransformerLM"]
    assert list(derived) == list(catalog.profiles["catalog_label"]) == [0, 1, 2]


def test_labels_compare_with_a_reference_catalog(tmp_path: Path) -> None:
    if not ARTIFACT.is_file():
        pytest.skip(f"reference catalog {ARTIFACT} missing (set LUCID_SHARED_DATA)")
    write_catalog(_journal(tmp_path), tmp_path)
    comparison = compare_labels(tmp_path, ARTIFACT)
    matched = {ours.model: (ours.label, ref.label) for ours, ref in comparison.matched}
    assert matched == {"ResNet18": (1, 0), "PPO": (0, 0)}  # the RTX 3090 says Tiny for ResNet18 b32
    assert [r.model for r in comparison.unmatched] == ["TransformerLM"]
    assert comparison.agreement == 0.5
    text = comparison_markdown(comparison, tmp_path, ARTIFACT)
    assert "Same label for 1 of 2 matched configurations." in text and "TransformerLM b16 amp1" in text


def test_emulated_profiles_come_from_the_reference_and_pairs_add_up() -> None:
    if not ARTIFACT.is_file():
        pytest.skip(f"reference catalog {ARTIFACT} missing (set LUCID_SHARED_DATA)")
    profiles = EmulatedProfiles.from_single_data(ARTIFACT)
    assert profiles.solo(RESNET) == (58.667, 25.0, 2360.0)
    assert profiles.solo(LM) == profiles.fallback  # no TransformerLM row in the reference
    heavy = WorkloadConfig("resnet18", 128)
    assert profiles.pair(heavy, heavy) == (100.0, 100.0, 6144.0)  # 96.25 % twice is capped


def test_trial_command_runs_both_processes_against_one_barrier() -> None:
    host = HostAddress(name="h", python="/opt/my env/bin/python")
    settings = CalibrationSettings(seconds=20, warmup_s=5, hold_s=2)
    command = trial_command(Trial((RESNET, PPO)), CalibrationTarget(host), settings)
    assert command.count("'/opt/my env/bin/python' -m lucid_core.calibration.workloads run") == 2
    assert command.count("--sync-dir sync --parties 2") == 2 and "--tag A" in command and "--tag B" in command
    assert "wait $pA || rc=1" in command and command.endswith("exit $rc")


def test_window_and_overlap_helpers() -> None:
    samples = [{"t": t, "gpu_util": 1.0} for t in (0.0, 1.0, 2.0, 3.0, 4.0)]
    assert [s["t"] for s in window_samples(samples, 1.5, 3.0, slack_s=0.5)] == [1.0, 2.0, 3.0]

    def result(start: float, end: float) -> WorkloadResult:
        return WorkloadResult("ppo", 32, False, "cpu", 10, end - start, 1, 1, start, end, "2")

    assert overlap_fraction([result(0, 10), result(1, 11)]) == pytest.approx(0.9)
    assert overlap_fraction([result(0, 1), result(2, 3)]) == 0.0


def test_catalog_sharing_key_reads_the_keys_falls_back_for_old_catalogs_and_tolerates_bad_files(
        tmp_path: Path) -> None:
    write_environment(tmp_path / "new", {"gpu_model": "NVIDIA H100 80GB HBM3", "sharing": "mps",
                                         "gpus": ["something else"]})
    assert catalog_sharing_key(tmp_path / "new") == ("NVIDIA H100 80GB HBM3", "mps")
    write_environment(tmp_path / "old", {"gpus": ["NVIDIA H200"], "telemetry": "nvml"})
    assert catalog_sharing_key(tmp_path / "old") == ("NVIDIA H200", None)  # written before the keys existed
    write_environment(tmp_path / "bare", {"gpu_model": None, "gpus": []})
    assert catalog_sharing_key(tmp_path / "bare") == (None, None)
    assert catalog_sharing_key(tmp_path / "missing") == (None, None)
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "environment.json").write_text('{"gpu_model": "NVI', encoding="utf-8")
    assert catalog_sharing_key(tmp_path / "torn") == (None, None)
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "environment.json").write_text("[1, 2]", encoding="utf-8")
    assert catalog_sharing_key(tmp_path / "list") == (None, None)


def test_catalog_sharing_key_of_the_h200_mps_catalog_measured_before_the_keys() -> None:
    directory = shared_data_dir() / "gpu_calibration_h200" / "mps" / "catalog"
    if not (directory / "environment.json").is_file():
        pytest.skip(f"H200 MPS catalog {directory} missing (set LUCID_SHARED_DATA)")
    # measured under MPS, but its environment.json predates the sharing key: the GPU is known, the sharing not
    assert catalog_sharing_key(directory) == ("NVIDIA H200", None)
