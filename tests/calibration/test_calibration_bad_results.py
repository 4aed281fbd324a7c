"""What a calibration reads into its catalog is a measurement, or that trial fails alone with why (B28).

The harness divides each pair's speeds by the configurations' solo speeds and labels a configuration by the
mean of its pairs. A solo that reported 0 iterations/s stopped the whole calibration with ZeroDivisionError;
one that stalled (0.001 it/s) made every pair of it run "50000x faster" and its label Tiny, so a pair measured
at half speed looked safe; a result line without WorkloadResult's fields raised TypeError; a journal edited or
cut short with NaN, negative or huge speeds went into the catalog on the next resume. A host stand-in answers
the harness's launches, polls and reads with what the test's workload processes "printed".
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from lucid_core.calibration.catalog import write_catalog
from lucid_core.calibration.configs import WorkloadConfig
from lucid_core.calibration.emulation import EmulatedProfiles
from lucid_core.calibration.harness import CalibrationSettings, CalibrationTarget, Calibrator
from lucid_core.calibration.journal import MAX_PAIR_SPEED, Journal, PairRecord, SoloRecord
from lucid_core.calibration.workloads.protocol import PREFIX, WorkloadResult
from lucid_core.domain import ShareClass
from lucid_core.runtime.hosts.executor import HostAddress, LaunchResult, RunStatus

NEUMF, POINTNET = WorkloadConfig("neumf", 32), WorkloadConfig("pointnet", 32)
SETTINGS = CalibrationSettings(seconds=0.1, warmup_s=0.0, startup_s=0.0, hold_s=0.0, poll_interval_s=0.0,
                               gpu_memory_mb=80000.0, max_attempts=1)
TELEMETRY = "\n".join(json.dumps({"t": 1000.0 + i / 10, "gpu": 0, "gpu_util": 30.0, "mem_util": 5.0,
                                  "mem_used_mb": 900.0, "job_mem_mb": 900.0, "emulated": True}) for i in range(11))


class StandInHost:
    """Answers the harness as a host whose workload processes print `solo[name]` (a result line, or any text)
    alone and run at `pair_ips` iterations/s beside a partner."""

    def __init__(self, solo: dict[str, str], pair_ips: float = 50.0) -> None:
        self.solo = solo
        self.pair_ips = pair_ips
        self.commands: dict[str, str] = {}

    def discover_gpus(self, host: HostAddress) -> list:
        return []

    def launch(self, host: HostAddress, spec) -> LaunchResult:
        self.commands[spec.run_id] = spec.command
        return LaunchResult(1, False)

    def poll(self, host: HostAddress, run_ids) -> dict[str, RunStatus]:
        return {run_id: RunStatus("EXITED", exit_code=0) for run_id in run_ids}

    def stop(self, *args, **kwargs) -> RunStatus:
        return RunStatus("EXITED", exit_code=0)

    def read(self, host: HostAddress, run_id: str, name: str, max_bytes: int = 1 << 20) -> str:
        if name == "telemetry.jsonl":
            return TELEMETRY
        if name != "stdout.log":
            return ""
        if "-env-" in run_id:
            return PREFIX + json.dumps({"event": "env", "gpus": ["stand-in"]}) + "\n"
        words = self.commands[run_id].split()
        names = [w for w in words if w in self.solo]
        if len(names) == 1:
            return self.solo[names[0]] + "\n"
        return "\n".join(result(n, self.pair_ips, tag) for n, tag in zip(names, "AB", strict=True)) + "\n"


def result(workload: str, ips: float, tag: str = "A") -> str:
    return WorkloadResult(workload, 32, False, "cpu", 10, 1.0, ips, ips * 32, 1000.0, 1001.0, "x", tag=tag).to_line()


def calibrate(tmp_path: Path, host: StandInHost) -> tuple[Calibrator, object]:
    address = HostAddress(name="stand-in", address="127.0.0.1", workdir=str(tmp_path / "runs"))
    calibrator = Calibrator(host, CalibrationTarget(address), tmp_path / "catalog", SETTINGS, EmulatedProfiles(),
                            progress=None, sleep=lambda s: None)
    return calibrator, calibrator.run([NEUMF, POINTNET])


def labels(directory: Path) -> dict[str, int]:
    with (directory / "single_data.csv").open(newline="") as handle:
        return {row["model"]: int(row["label"]) for row in csv.DictReader(handle)}


@pytest.mark.parametrize("printed", [
    result("neumf", 0.0), result("neumf", float("nan")), result("neumf", -3.0), result("neumf", float("inf")),
    PREFIX + json.dumps({"event": "result", "tag": "A", "iters_per_s": 5.0}),  # not WorkloadResult's fields
    PREFIX + json.dumps({"event": "result", **json.loads(result("neumf", 5.0)[len(PREFIX):]), "iters_per_s": "5"}),
], ids=["zero", "nan", "negative", "infinite", "fields missing", "speed as text"])
def test_a_solo_that_reports_no_speed_fails_alone_with_why_and_the_calibration_finishes(tmp_path, printed):
    calibrator, report = calibrate(tmp_path, StandInHost({"neumf": printed, "pointnet": result("pointnet", 100.0)}))
    assert report.failed[0] == f"solo-{NEUMF.key}"  # that trial, and the pairs that need it, fail
    assert f"pair-{POINTNET.key}-{POINTNET.key}" in report.measured  # the rest is measured
    assert NEUMF.key not in calibrator.journal.solos
    assert "NeuMF" not in labels(tmp_path / "catalog")
    failed = [json.loads(line) for line in (tmp_path / "catalog" / "measurements.jsonl").read_text().splitlines()
              if json.loads(line)["kind"] == "failed"]
    assert failed and failed[0]["run_id"] in failed[0]["error"]


def test_a_stalled_solo_cannot_make_its_pairs_look_fast_and_its_configuration_tiny(tmp_path):
    calibrator, report = calibrate(tmp_path, StandInHost({"neumf": result("neumf", 0.001),
                                                          "pointnet": result("pointnet", 100.0)}))
    # beside a partner it "ran" 50000 times faster than alone: the pair is no measurement, and says why
    assert f"pair-{NEUMF.key}-{POINTNET.key}" in report.failed
    assert not calibrator.journal.has_pair(NEUMF, POINTNET)
    assert labels(tmp_path / "catalog")["NeuMF"] == int(ShareClass.JUMBO)  # never co-located: Jumbo, as documented


def _solo(config: WorkloadConfig, ips: float = 100.0) -> SoloRecord:
    return SoloRecord(config, ips, ips * 32, 30.0, 5.0, 900.0, 10, True, f"calib-x-solo-{config.key}-a1", "h", 0)


def _pair(speed_first: float, speed_second: float) -> PairRecord:
    return PairRecord(NEUMF, POINTNET, speed_first, speed_second, 50.0, 50.0, 60.0, 10.0, 1800.0, 1.0, 10, True,
                      "calib-x-pair-a1", "h", 0)


@pytest.mark.parametrize("speeds", [(float("nan"), 0.5), (1e9, 0.5), (-5.0, 0.5), (0.5, MAX_PAIR_SPEED + 0.01),
                                    (0.005, 0.5)])  # below the catalog readers' 0.01: the catalog could not be read
def test_a_journal_holding_an_impossible_speed_is_measured_again_and_never_labels_tiny(tmp_path, speeds,
                                                                                        capsys):
    journal = Journal.open(tmp_path)
    journal.append(_solo(NEUMF))
    journal.append(_solo(POINTNET))
    journal.append(_pair(*speeds))  # as an edit, or a run before this check, left it
    journal.append(_solo(POINTNET, ips=float("nan")))  # a duplicate, broken solo: the good one stands
    reopened = Journal.open(tmp_path)
    assert len(reopened.rejected) == 2 and "line 3" in reopened.rejected[0] and "line 4" in reopened.rejected[1]
    assert not reopened.pairs and reopened.solos[POINTNET.key].iters_per_s == 100.0
    write_catalog(reopened, tmp_path / "catalog")
    assert labels(tmp_path / "catalog") == {"NeuMF": int(ShareClass.JUMBO), "PointNet": int(ShareClass.JUMBO)}
    address = HostAddress(name="stand-in", address="127.0.0.1", workdir=str(tmp_path / "runs"))
    Calibrator(StandInHost({}), CalibrationTarget(address), tmp_path, SETTINGS, progress=None)  # a resume
    warned = [line for line in capsys.readouterr().err.splitlines() if "not believed, measured again" in line]
    assert len(warned) == 2 and "line 3" in warned[0]
