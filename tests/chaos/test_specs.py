"""Fault specs: what parses, with which defaults, and every refusal naming its field."""

from __future__ import annotations

import math
from typing import Any

import pytest

from glassbox.chaos.specs import (
    DEFAULT_SIGMA,
    MAX_TTL_S,
    ErrorSpec,
    FaultSpec,
    FragmentationSpec,
    LatencySpec,
    OomSpec,
    parse_spec,
)
from glassbox.service.errors import ChaosInvalidFaultError


@pytest.mark.parametrize(("raw", "expected"), [
    ({"fault": "oom", "ttl_s": 30}, FaultSpec("oom", 30.0, OomSpec("raise"))),
    ({"fault": "oom", "ttl_s": 1.5, "batches": 3}, FaultSpec("oom", 1.5, OomSpec("raise", batches=3))),
    ({"fault": "oom", "ttl_s": 10, "mode": "fill", "free_mib": 0}, FaultSpec("oom", 10.0, OomSpec("fill", None, 0))),
    ({"fault": "latency", "ttl_s": 5, "delay_ms": 50}, FaultSpec("latency", 5.0, LatencySpec("fixed", 50.0))),
    ({"fault": "latency", "ttl_s": 5, "distribution": "uniform", "min_ms": 10, "max_ms": 30},
     FaultSpec("latency", 5.0, LatencySpec("uniform", None, 10.0, 30.0))),
    ({"fault": "latency", "ttl_s": 5, "distribution": "exponential", "delay_ms": 20},
     FaultSpec("latency", 5.0, LatencySpec("exponential", 20.0))),
    ({"fault": "latency", "ttl_s": 5, "distribution": "lognormal", "delay_ms": 20},
     FaultSpec("latency", 5.0, LatencySpec("lognormal", 20.0, sigma=DEFAULT_SIGMA))),
    ({"fault": "latency", "ttl_s": 5, "distribution": "lognormal", "delay_ms": 20, "sigma": 1.2},
     FaultSpec("latency", 5.0, LatencySpec("lognormal", 20.0, sigma=1.2))),
    ({"fault": "error", "ttl_s": MAX_TTL_S, "fraction": 0.25}, FaultSpec("error", MAX_TTL_S, ErrorSpec(0.25))),
    ({"fault": "error", "ttl_s": 1, "fraction": 1}, FaultSpec("error", 1.0, ErrorSpec(1.0))),
    ({"fault": "fragmentation", "ttl_s": 60, "inactive_mib": 512},
     FaultSpec("fragmentation", 60.0, FragmentationSpec(512))),
])
def test_valid_specs_parse_with_defaults_filled_in(raw: dict[str, Any], expected: FaultSpec) -> None:
    assert parse_spec(raw) == expected


@pytest.mark.parametrize(("raw", "field"), [
    ([], "body"),
    ({"ttl_s": 5}, "fault"),
    ({"fault": "disk", "ttl_s": 5}, "fault"),
    ({"fault": "oom"}, "ttl_s"),
    ({"fault": "oom", "ttl_s": 0}, "ttl_s"),
    ({"fault": "oom", "ttl_s": -1}, "ttl_s"),
    ({"fault": "oom", "ttl_s": MAX_TTL_S + 1}, "ttl_s"),
    ({"fault": "oom", "ttl_s": "5"}, "ttl_s"),
    ({"fault": "oom", "ttl_s": True}, "ttl_s"),
    ({"fault": "oom", "ttl_s": math.inf}, "ttl_s"),
    ({"fault": "oom", "ttl_s": 5, "mode": "leak"}, "mode"),
    ({"fault": "oom", "ttl_s": 5, "batches": 0}, "batches"),
    ({"fault": "oom", "ttl_s": 5, "batches": 1.5}, "batches"),
    ({"fault": "oom", "ttl_s": 5, "batches": True}, "batches"),
    ({"fault": "oom", "ttl_s": 5, "free_mib": 100}, "free_mib"),  # raise mode takes no free_mib
    ({"fault": "oom", "ttl_s": 5, "mode": "fill"}, "free_mib"),
    ({"fault": "oom", "ttl_s": 5, "mode": "fill", "free_mib": -1}, "free_mib"),
    ({"fault": "oom", "ttl_s": 5, "mode": "fill", "free_mib": 10, "batches": 2}, "batches"),
    ({"fault": "oom", "ttl_s": 5, "delay_ms": 3}, "delay_ms"),  # another fault's parameter
    ({"fault": "latency", "ttl_s": 5}, "delay_ms"),
    ({"fault": "latency", "ttl_s": 5, "delay_ms": 0}, "delay_ms"),
    ({"fault": "latency", "ttl_s": 5, "delay_ms": 60_001}, "delay_ms"),
    ({"fault": "latency", "ttl_s": 5, "delay_ms": 5, "distribution": "pareto"}, "distribution"),
    ({"fault": "latency", "ttl_s": 5, "delay_ms": 5, "sigma": 1}, "sigma"),
    ({"fault": "latency", "ttl_s": 5, "delay_ms": 5, "min_ms": 1}, "min_ms"),
    ({"fault": "latency", "ttl_s": 5, "distribution": "uniform", "max_ms": 5}, "min_ms"),
    ({"fault": "latency", "ttl_s": 5, "distribution": "uniform", "min_ms": 5}, "max_ms"),
    ({"fault": "latency", "ttl_s": 5, "distribution": "uniform", "min_ms": 9, "max_ms": 5}, "max_ms"),
    ({"fault": "latency", "ttl_s": 5, "distribution": "uniform", "min_ms": 1, "max_ms": 5, "delay_ms": 3},
     "delay_ms"),
    ({"fault": "latency", "ttl_s": 5, "distribution": "lognormal", "delay_ms": 5, "sigma": 0}, "sigma"),
    ({"fault": "error", "ttl_s": 5}, "fraction"),
    ({"fault": "error", "ttl_s": 5, "fraction": 1.01}, "fraction"),
    ({"fault": "error", "ttl_s": 5, "fraction": -0.1}, "fraction"),
    ({"fault": "error", "ttl_s": 5, "fraction": 0.5, "fractoin": 0.5}, "fractoin"),
    ({"fault": "fragmentation", "ttl_s": 5}, "inactive_mib"),
    ({"fault": "fragmentation", "ttl_s": 5, "inactive_mib": 0}, "inactive_mib"),
    ({"fault": "fragmentation", "ttl_s": 5, "inactive_mib": 2.5}, "inactive_mib"),
])
def test_invalid_specs_are_refused_naming_the_field(raw: Any, field: str) -> None:
    with pytest.raises(ChaosInvalidFaultError) as caught:
        parse_spec(raw)
    assert caught.value.message.startswith(f"{field}:"), caught.value.message
    assert caught.value.code == "chaos_invalid_fault"


def test_params_json_lists_only_what_applies() -> None:
    assert parse_spec({"fault": "oom", "ttl_s": 5}).params_json() == {"mode": "raise"}
    spec = parse_spec({"fault": "latency", "ttl_s": 5, "distribution": "uniform", "min_ms": 1, "max_ms": 3})
    assert spec.params_json() == {"distribution": "uniform", "min_ms": 1.0, "max_ms": 3.0}


@pytest.mark.parametrize(("raw", "gpu"), [
    ({"fault": "oom", "ttl_s": 5}, False),
    ({"fault": "oom", "ttl_s": 5, "mode": "fill", "free_mib": 10}, True),
    ({"fault": "fragmentation", "ttl_s": 5, "inactive_mib": 10}, True),
    ({"fault": "latency", "ttl_s": 5, "delay_ms": 1}, False),
    ({"fault": "error", "ttl_s": 5, "fraction": 0.1}, False),
])
def test_only_memory_holding_faults_need_a_gpu(raw: dict[str, Any], gpu: bool) -> None:
    assert parse_spec(raw).needs_gpu is gpu


@pytest.mark.parametrize(("spec", "mean"), [
    (LatencySpec("fixed", 40.0), 40.0),
    (LatencySpec("uniform", None, 10.0, 30.0), 20.0),
    (LatencySpec("exponential", 25.0), 25.0),
    (LatencySpec("lognormal", 20.0, sigma=0.5), 20.0 * math.exp(0.125)),
])
def test_mean_of_each_distribution(spec: LatencySpec, mean: float) -> None:
    assert spec.mean_ms == pytest.approx(mean)
