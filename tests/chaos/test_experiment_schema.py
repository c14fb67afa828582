"""Experiment YAML: the shipped files load, defaults fill in, and every bad field is refused by name."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from glassbox.chaos.experiment import ROLLBACKS, DriftCheck, ExperimentError, Texts
from glassbox.chaos.samples import ERROR_KINDS
from glassbox.chaos.schema import load_experiment, parse_experiment

EXPERIMENTS = Path(__file__).resolve().parents[2] / "chaos" / "experiments"
SHIPPED = ("oom-fallback", "memory-fragmentation", "slow-clients", "latency-spike", "overload", "label-shift")


def minimal() -> dict[str, Any]:
    return {
        "title": "t",
        "load": {"rate": 10},
        "hypothesis": {"p99_ratio_max": 2},
        "method": [
            {"phase": "baseline", "duration_s": 1},
            {"phase": "fault", "duration_s": 2, "actions": [{"arm": {"fault": "latency", "delay_ms": 5}}]},
            {"phase": "recovery", "duration_s": 3},
        ],
    }


def test_every_shipped_experiment_loads() -> None:
    found = sorted(p.stem for p in EXPERIMENTS.glob("*.yaml"))
    assert found == sorted(SHIPPED)
    for name in SHIPPED:
        experiment = load_experiment(EXPERIMENTS / f"{name}.yaml")
        assert experiment.name == name
        assert [p.name for p in experiment.phases] == ["baseline", "fault", "recovery"]
        assert experiment.title and experiment.description


def test_defaults_fill_in() -> None:
    experiment = parse_experiment(minimal(), "m")
    assert experiment.load.protocol == "json" and experiment.load.warmup_s == 0.0
    assert experiment.hypothesis.error_budget.kinds == ERROR_KINDS
    assert experiment.hypothesis.error_budget.fault == 0.0
    assert experiment.hypothesis.expect_fallback is None
    assert experiment.target.model == "default" and experiment.target.serve_args == ()
    assert experiment.rollbacks == ROLLBACKS
    assert experiment.duration_s == 6.0
    assert experiment.phase("fault").actions[0].arm == {"fault": "latency", "delay_ms": 5}


def test_scaled_shortens_phases_and_rates_but_not_time_tolerances() -> None:
    raw = minimal()
    raw["method"][1]["rate"] = 40
    raw["load"]["warmup_s"] = 2
    raw["hypothesis"]["recovery_time_max_s"] = 5
    scaled = parse_experiment(raw, "m").scaled(duration=0.5, rate=0.25)
    assert [p.duration_s for p in scaled.phases] == [0.5, 1.0, 1.5]
    assert scaled.load.rate == 2.5 and scaled.phase("fault").rate == 10.0 and scaled.phase("baseline").rate is None
    assert scaled.load.warmup_s == 1.0
    assert scaled.hypothesis.recovery_time_max_s == 5 and scaled.hypothesis.recovery_window_s == 1.0
    with pytest.raises(ExperimentError):
        scaled.scaled(duration=0)
    for duration, rate in [(math.nan, 1.0), (1.0, math.inf)]:  # nan <= 0 is False: a sign check lets nan through
        with pytest.raises(ExperimentError, match="scale factors must be positive and finite"):
            scaled.scaled(duration, rate)


def test_rates_relative_to_capacity_resolve_against_the_measured_capacity() -> None:
    raw = minimal()
    raw["load"]["rate"] = "0.5x"
    raw["load"]["capacity"] = {"connections": 8, "duration_s": 2}
    raw["method"][1]["rate"] = "3x"
    experiment = parse_experiment(raw, "m")
    assert experiment.load.relative and (experiment.load.capacity_connections, experiment.load.capacity_duration_s) \
        == (8, 2.0)
    resolved = experiment.resolved(200.0)
    assert not resolved.load.relative
    assert resolved.load.rate == 100.0 and resolved.phase("fault").rate == 600.0
    assert resolved.rate_of(resolved.phase("recovery")) == 100.0
    assert parse_experiment(minimal(), "m").resolved(200.0).load.rate == minimal()["load"]["rate"]  # absolute: as is
    with pytest.raises(ExperimentError, match="served nothing"):
        experiment.resolved(0.0)


def test_texts_path_is_relative_to_the_file(tmp_path: Path) -> None:
    raw = minimal()
    raw["load"]["texts"] = "texts.txt"
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert load_experiment(path).load.texts == Texts(file=tmp_path / "texts.txt")


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(raw: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = raw
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[int(last) if last.isdigit() else last] = value
    return apply


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda raw: raw.pop(key)


BAD: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("no title", _drop("title"), "title: required"),
    ("unknown top key", _set("colour", "red"), "colour: unknown key"),
    ("no load", _drop("load"), "load: required"),
    ("rate zero", _set("load.rate", 0), "load.rate: must be > 0"),
    ("rate text", _set("load.rate", "fast"), "load.rate: a rate is requests/s or a positive multiple of capacity"),
    ("rate zero times", _set("load.rate", "0x"), "load.rate: a rate is requests/s or a positive multiple"),
    ("mixed rates", lambda raw: (_set("load.rate", "0.5x")(raw), _set("method.1.rate", 40)(raw)),
     "method[1].rate: load.rate is a multiple of capacity"),
    ("capacity key", _set("load.capacity", {"clients": 3}), "load.capacity.clients: unknown key"),
    ("refusal p99", _set("hypothesis.refusal_p99_max_ms", 0), "hypothesis.refusal_p99_max_ms: must be > 0"),
    ("rate bool", _set("load.rate", True), "load.rate: expected number"),
    ("protocol", _set("load.protocol", "grpc"), "load.protocol: must be one of json, frames"),
    ("unknown load key", _set("load.burst", 3), "load.burst: unknown key"),
    ("negative warmup", _set("load.warmup_s", -1), "load.warmup_s: must be >= 0"),
    ("budget kind", _set("hypothesis.error_budget", {"kinds": ["http_418"]}),
     "hypothesis.error_budget.kinds[0]: must be one of"),
    ("budget above 1", _set("hypothesis.error_budget", {"fault": 1.5}), "hypothesis.error_budget.fault: must be"),
    ("budget unknown phase", _set("hypothesis.error_budget", {"warmup": 0.1}),
     "hypothesis.error_budget.warmup: unknown key"),
    ("expect_fallback text", _set("hypothesis.expect_fallback", "yes"), "hypothesis.expect_fallback: expected bool"),
    ("ratio negative", _set("hypothesis.p99_ratio_max", -1), "hypothesis.p99_ratio_max: must be > 0"),
    ("tolerance below 1", _set("hypothesis.recovery_tolerance", 0.5), "hypothesis.recovery_tolerance: must be >= 1"),
    ("unknown hypothesis key", _set("hypothesis.p95_max", 1), "hypothesis.p95_max: unknown key"),
    ("two phases", lambda raw: raw["method"].pop(), "method: expected exactly 3 phases"),
    ("phase order", _set("method.0.phase", "fault"), "method[0].phase: the method is baseline, fault, recovery"),
    ("phase name", _set("method.2.phase", "cooldown"), "method[2].phase: must be one of"),
    ("duration", _set("method.0.duration_s", 0), "method[0].duration_s: must be > 0"),
    ("no duration", lambda raw: raw["method"][0].pop("duration_s"), "method[0].duration_s: required"),
    ("baseline action", _set("method.0.actions", [{"arm": {"fault": "error", "fraction": 1}}]),
     "method[0].actions: only the fault phase"),
    ("profile", _set("method.1.profile", "sine"), "method[1].profile: must be one of steady, step, burst"),
    ("fault kind", _set("method.1.actions", [{"arm": {"fault": "meteor"}}]),
     "method[1].actions[0].arm.fault: expected one of"),
    ("fault param missing", _set("method.1.actions", [{"arm": {"fault": "latency"}}]),
     "method[1].actions[0].arm.delay_ms: required"),
    ("fault param typo", _set("method.1.actions", [{"arm": {"fault": "oom", "batch": 3}}]),
     "method[1].actions[0].arm.batch: not a parameter of the oom fault"),
    ("fault param range", _set("method.1.actions", [{"arm": {"fault": "error", "fraction": 2}}]),
     "method[1].actions[0].arm.fraction: must be"),
    ("two keys in an action", _set("method.1.actions", [{"arm": {"fault": "error", "fraction": 1},
                                                         "slow_clients": {"connections": 1}}]),
     "method[1].actions[0]: an action has exactly one key"),
    ("unknown action", _set("method.1.actions", [{"flood": {}}]), "method[1].actions[0].flood: unknown key"),
    ("slow mode", _set("method.1.actions", [{"slow_clients": {"connections": 5, "mode": "lazy"}}]),
     "method[1].actions[0].slow_clients.mode: must be one of headers, body, reader"),
    ("slow connections", _set("method.1.actions", [{"slow_clients": {"mode": "body"}}]),
     "method[1].actions[0].slow_clients.connections: required"),
    ("fault phase does nothing", _set("method.1.actions", []), "method[1]: the fault phase needs an action"),
    ("rollback", _set("rollbacks", ["reboot"]), "rollbacks[0]: must be one of disarm_faults, stop_slow_clients"),
    ("serve_args", _set("target.serve_args", "--no-cpu-fallback"), "target.serve_args: expected list"),
    ("target key", _set("target.gpu", True), "target.gpu: unknown key"),
]


@pytest.mark.parametrize(("change", "message"), [(c, m) for _, c, m in BAD], ids=[i for i, _, _ in BAD])
def test_bad_field_is_refused_by_name(change: Callable[[dict[str, Any]], None], message: str) -> None:
    raw = copy.deepcopy(minimal())
    change(raw)
    with pytest.raises(ExperimentError) as caught:
        parse_experiment(raw, "m")
    assert message in caught.value.message, caught.value.message


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("title: [unclosed\n")
    with pytest.raises(ExperimentError, match="not valid YAML"):
        load_experiment(broken)
    bad = tmp_path / "bad.yaml"
    raw = minimal()
    raw["load"]["rate"] = -3
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ExperimentError, match=r"bad\.yaml: load\.rate: must be > 0"):
        load_experiment(bad)
    with pytest.raises(ExperimentError, match="cannot read"):
        load_experiment(tmp_path / "missing.yaml")
    binary = tmp_path / "garbage.txt"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ExperimentError, match=r"cannot read .*garbage\.txt: not UTF-8 text"):
        load_experiment(binary)
    not_mapping = tmp_path / "list.yaml"
    not_mapping.write_text("- 1\n- 2\n")
    with pytest.raises(ExperimentError, match="expected a mapping"):
        load_experiment(not_mapping)


def test_texts_come_from_a_file_or_the_held_out_split_and_the_fault_phase_may_shift_them(tmp_path: Path) -> None:
    raw = minimal()
    raw["load"]["texts"] = "texts.txt"
    raw["method"][1] = {"phase": "fault", "duration_s": 2, "texts": {"heldout": True, "label": "negative"}}
    raw["hypothesis"]["drift"] = {"threshold": 0.3}
    experiment = parse_experiment(raw, "shift", tmp_path)
    assert experiment.load.texts == Texts(file=tmp_path / "texts.txt")
    assert experiment.phase("fault").texts == Texts(heldout=True, label="negative")
    assert experiment.hypothesis.drift == DriftCheck("labels", 0.3, 120.0)  # a shift alone is a fault phase


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r["load"].update(texts={"heldout": True, "file": "x"}), "load.texts: give exactly one of file"),
    (lambda r: r["load"].update(texts={"label": "x"}), "load.texts: give exactly one of file"),
    (lambda r: r["load"].update(texts={"heldout": True, "lable": "x"}), r"load.texts.lable: unknown key"),
    (lambda r: r["method"][0].update(texts={"heldout": True}), r"method\[0\].texts: only the fault phase"),
    (lambda r: r["hypothesis"].update(drift={"distribution": "mood"}), r"hypothesis.drift.distribution: must be one"),
    (lambda r: r["hypothesis"].update(drift={"threshold": 0}), r"hypothesis.drift.threshold: must be > 0"),
])
def test_bad_texts_and_drift_fields_are_refused_by_name(change: Callable[[dict[str, Any]], None], message: str
                                                        ) -> None:
    raw = minimal()
    change(raw)
    with pytest.raises(ExperimentError, match=message):
        parse_experiment(raw, "bad")
