"""Fault specs: what the chaos control API accepts, parsed from JSON into frozen records.

`parse_spec` refuses anything malformed with ChaosInvalidFaultError whose message starts with the field's name, and
refuses parameters a fault does not take, so a typo in an experiment file fails loudly instead of arming something
else than what was meant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, cast, get_args

from service.errors import ChaosInvalidFaultError

FaultKind = Literal["oom", "latency", "error", "fragmentation"]
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
Distribution = Literal["fixed", "uniform", "exponential", "lognormal"]
OomMode = Literal["raise", "fill"]

MAX_TTL_S = 3600.0
MAX_DELAY_MS = 60_000.0  # also the cap on any single draw from a long-tailed distribution
MAX_MIB = 1 << 20  # 1 TiB: beyond any device, so only nonsense is refused
DEFAULT_SIGMA = 0.5


@dataclass(frozen=True, slots=True)
class OomSpec:
    mode: OomMode = "raise"
    batches: int | None = None  # raise mode: fail only the next N primary batches, then disarm
    free_mib: int | None = None  # fill mode: allocate until this much is left


@dataclass(frozen=True, slots=True)
class LatencySpec:
    distribution: Distribution = "fixed"
    delay_ms: float | None = None  # fixed: the delay; exponential: the mean; lognormal: the median
    min_ms: float | None = None  # uniform only
    max_ms: float | None = None  # uniform only
    sigma: float | None = None  # lognormal only: the spread of log(delay)

    @property
    def mean_ms(self) -> float:
        """The distribution's mean, before the per-draw cap of MAX_DELAY_MS."""
        if self.distribution == "uniform":
            return ((self.min_ms or 0.0) + (self.max_ms or 0.0)) / 2
        if self.distribution == "lognormal":
            return (self.delay_ms or 0.0) * math.exp((self.sigma or 0.0) ** 2 / 2)
        return self.delay_ms or 0.0


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    fraction: float


@dataclass(frozen=True, slots=True)
class FragmentationSpec:
    inactive_mib: int


Params = OomSpec | LatencySpec | ErrorSpec | FragmentationSpec


@dataclass(frozen=True, slots=True)
class FaultSpec:
    kind: FaultKind
    ttl_s: float
    params: Params

    @property
    def needs_gpu(self) -> bool:
        """Faults that hold real device memory; the others are simulated on the engine thread."""
        return isinstance(self.params, FragmentationSpec) or (
            isinstance(self.params, OomSpec) and self.params.mode == "fill"
        )

    def params_json(self) -> dict[str, Any]:
        return {f.name: getattr(self.params, f.name) for f in fields(self.params)
                if getattr(self.params, f.name) is not None}


class _Fields:
    """Reads typed fields out of a JSON object; every refusal names the field, and leftovers are refused."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self._raw = raw
        self._read: set[str] = set()

    def present(self, name: str) -> bool:
        return name in self._raw

    def number(self, name: str, *, low: float, high: float, low_open: bool = False,
               required: bool = False) -> float | None:
        value = self._take(name, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ChaosInvalidFaultError(f"{name}: expected a number, got {value!r}")
        if (value <= low if low_open else value < low) or value > high:
            bound = "above" if low_open else "at least"
            raise ChaosInvalidFaultError(f"{name}: must be {bound} {low:g} and at most {high:g}, got {value!r}")
        return float(value)

    def integer(self, name: str, *, low: int, high: int, required: bool = False) -> int | None:
        value = self._take(name, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ChaosInvalidFaultError(f"{name}: expected an integer, got {value!r}")
        if not low <= value <= high:
            raise ChaosInvalidFaultError(f"{name}: must be {low}..{high}, got {value}")
        return value

    def choice(self, name: str, allowed: tuple[str, ...], default: str) -> str:
        value = self._take(name, False)
        if value is None:
            return default
        if value not in allowed:
            raise ChaosInvalidFaultError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
        return str(value)

    def refuse(self, name: str, why: str) -> None:
        if name in self._raw:
            raise ChaosInvalidFaultError(f"{name}: {why}")

    def finish(self, kind: str) -> None:
        unknown = sorted(set(self._raw) - self._read)
        if unknown:
            raise ChaosInvalidFaultError(f"{unknown[0]}: not a parameter of the {kind} fault")

    def _take(self, name: str, required: bool) -> Any:
        self._read.add(name)
        value = self._raw.get(name)
        if value is None and required:
            raise ChaosInvalidFaultError(f"{name}: required")
        return value


def parse_spec(raw: Any) -> FaultSpec:
    """A fault spec from its JSON form: `{"fault": KIND, "ttl_s": seconds, ...params}`."""
    if not isinstance(raw, dict):
        raise ChaosInvalidFaultError(f"body: expected a JSON object, got {type(raw).__name__}")
    read = _Fields(raw)
    kind = read.choice("fault", FAULT_KINDS, "")
    if not kind:
        raise ChaosInvalidFaultError(f"fault: required, one of {', '.join(FAULT_KINDS)}")
    ttl_s = read.number("ttl_s", low=0.0, high=MAX_TTL_S, low_open=True, required=True)
    assert ttl_s is not None
    params = _PARSERS[kind](read)
    read.finish(kind)
    return FaultSpec(cast(FaultKind, kind), ttl_s, params)


def _oom(read: _Fields) -> OomSpec:
    mode = read.choice("mode", get_args(OomMode), "raise")
    if mode == "fill":
        read.refuse("batches", "only with mode raise (a fill holds memory for its time-to-live)")
        free_mib = read.integer("free_mib", low=0, high=MAX_MIB, required=True)
        return OomSpec("fill", None, free_mib)
    read.refuse("free_mib", "only with mode fill")
    return OomSpec("raise", read.integer("batches", low=1, high=1_000_000), None)


def _latency(read: _Fields) -> LatencySpec:
    distribution = read.choice("distribution", get_args(Distribution), "fixed")
    if distribution == "uniform":
        read.refuse("delay_ms", "not used by the uniform distribution; give min_ms and max_ms")
        read.refuse("sigma", "only for the lognormal distribution")
        low = read.number("min_ms", low=0.0, high=MAX_DELAY_MS, required=True)
        high = read.number("max_ms", low=0.0, high=MAX_DELAY_MS, required=True)
        assert low is not None and high is not None
        if high < low:
            raise ChaosInvalidFaultError(f"max_ms: must be at least min_ms ({low:g}), got {high:g}")
        return LatencySpec("uniform", None, low, high, None)
    for name in ("min_ms", "max_ms"):
        read.refuse(name, "only for the uniform distribution")
    delay = read.number("delay_ms", low=0.0, high=MAX_DELAY_MS, low_open=True, required=True)
    if distribution == "lognormal":
        sigma = read.number("sigma", low=0.0, high=3.0, low_open=True)
        return LatencySpec("lognormal", delay, None, None, DEFAULT_SIGMA if sigma is None else sigma)
    read.refuse("sigma", "only for the lognormal distribution")
    return LatencySpec(cast(Distribution, distribution), delay, None, None, None)


def _error(read: _Fields) -> ErrorSpec:
    fraction = read.number("fraction", low=0.0, high=1.0, required=True)
    assert fraction is not None
    return ErrorSpec(fraction)


def _fragmentation(read: _Fields) -> FragmentationSpec:
    inactive = read.integer("inactive_mib", low=1, high=MAX_MIB, required=True)
    assert inactive is not None
    return FragmentationSpec(inactive)


_PARSERS: dict[str, Callable[[_Fields], Params]] = {
    "oom": _oom, "latency": _latency, "error": _error, "fragmentation": _fragmentation,
}
