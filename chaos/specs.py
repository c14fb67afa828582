"""Fault specs: what the chaos control API accepts, parsed from JSON into frozen records.

`parse_spec` validates the JSON with msgspec structs (one per fault, tagged by "fault"), so types, bounds and the
parameters a fault takes are stated once, as types; it refuses anything malformed with ChaosInvalidFaultError whose
message starts with the field's name, and refuses parameters a fault does not take, so a typo in an experiment file
fails loudly instead of arming something else than what was meant. The rules between fields (which distribution
takes which parameters) are checked after.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal, get_args

import msgspec

from glassbox.service.errors import ChaosInvalidFaultError

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


# --- the JSON form, validated by msgspec: types, bounds and unknown fields; the rules between fields follow ----------
_Ttl = Annotated[float, msgspec.Meta(gt=0, le=MAX_TTL_S)]
_Delay = Annotated[float, msgspec.Meta(gt=0, le=MAX_DELAY_MS)]
_Bound = Annotated[float, msgspec.Meta(ge=0, le=MAX_DELAY_MS)]


class _Body(msgspec.Struct, forbid_unknown_fields=True, frozen=True, tag_field="fault"):
    ttl_s: _Ttl


class _OomBody(_Body, frozen=True, tag="oom"):
    mode: OomMode = "raise"
    batches: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None
    free_mib: Annotated[int, msgspec.Meta(ge=0, le=MAX_MIB)] | None = None


class _LatencyBody(_Body, frozen=True, tag="latency"):
    distribution: Distribution = "fixed"
    delay_ms: _Delay | None = None
    min_ms: _Bound | None = None
    max_ms: _Bound | None = None
    sigma: Annotated[float, msgspec.Meta(gt=0, le=3.0)] | None = None


class _ErrorBody(_Body, frozen=True, tag="error"):
    fraction: Annotated[float, msgspec.Meta(ge=0, le=1)]


class _FragmentationBody(_Body, frozen=True, tag="fragmentation"):
    inactive_mib: Annotated[int, msgspec.Meta(ge=1, le=MAX_MIB)]


_Bodies = _OomBody | _LatencyBody | _ErrorBody | _FragmentationBody
_AT = re.compile(r"^(?P<why>.*) - at `\$\.(?P<field>[A-Za-z_]+)`$")
_BOUND = re.compile(r"^Expected `\w+` (?P<bound>[<>]=? .+)$")
_KIND = re.compile(r"^Expected `(?P<kind>[^`]+)`, got `\w+`$")
_KIND_NAMES = {"float": "a number", "int": "an integer", "str": "a string"}
_CHOICES: dict[str, tuple[str, ...]] = {"fault": FAULT_KINDS, "mode": get_args(OomMode),
                                        "distribution": get_args(Distribution)}
_NAMED = re.compile(r"^Object (?:missing required|contains unknown) field `(?P<field>[A-Za-z_]+)`$")


def parse_spec(raw: Any) -> FaultSpec:
    """A fault spec from its JSON form: `{"fault": KIND, "ttl_s": seconds, ...params}`."""
    try:
        body = msgspec.convert(raw, _Bodies, strict=True)
    except msgspec.ValidationError as exc:
        raise ChaosInvalidFaultError(_naming_the_field(str(exc), raw)) from None
    if isinstance(body, _OomBody):
        return FaultSpec("oom", body.ttl_s, _oom(body))
    if isinstance(body, _LatencyBody):
        return FaultSpec("latency", body.ttl_s, _latency(body))
    if isinstance(body, _ErrorBody):
        return FaultSpec("error", body.ttl_s, ErrorSpec(body.fraction))
    return FaultSpec("fragmentation", body.ttl_s, FragmentationSpec(body.inactive_mib))


def _naming_the_field(error: str, raw: Any) -> str:
    """msgspec's message as the field it is about and what it must be ("ttl_s: must be <= 3600, got 5000")."""
    if (at := _AT.match(error)) is not None:
        field, why = at["field"], at["why"]
        value = raw.get(field)
        if field in _CHOICES:
            return f"{field}: expected one of {', '.join(_CHOICES[field])}, got {value!r}"
        if (bound := _BOUND.match(why)) is not None:
            return f"{field}: must be {bound['bound']}, got {value!r}"
        if (kind := _KIND.match(why)) is not None:
            kinds = " or ".join(_KIND_NAMES.get(name, name) for name in kind["kind"].split(" | "))
            return f"{field}: expected {kinds}, got {value!r}"
        return f"{field}: {why}"
    if (named := _NAMED.match(error)) is not None:
        field = named["field"]
        if "unknown" in error:
            return f"{field}: not a parameter of the {raw.get('fault')} fault"
        return f"{field}: required" + (f", one of {', '.join(FAULT_KINDS)}" if field == "fault" else "")
    return f"body: {error}"


def _refuse(name: str, value: object, why: str) -> None:
    if value is not None:
        raise ChaosInvalidFaultError(f"{name}: {why}")


def _required(name: str, value: float | None) -> float:
    if value is None:
        raise ChaosInvalidFaultError(f"{name}: required")
    return value


def _oom(body: _OomBody) -> OomSpec:
    if body.mode == "fill":
        _refuse("batches", body.batches, "only with mode raise (a fill holds memory for its time-to-live)")
        return OomSpec("fill", None, int(_required("free_mib", body.free_mib)))
    _refuse("free_mib", body.free_mib, "only with mode fill")
    return OomSpec("raise", body.batches, None)


def _latency(body: _LatencyBody) -> LatencySpec:
    if body.distribution == "uniform":
        _refuse("delay_ms", body.delay_ms, "not used by the uniform distribution; give min_ms and max_ms")
        _refuse("sigma", body.sigma, "only for the lognormal distribution")
        low, high = _required("min_ms", body.min_ms), _required("max_ms", body.max_ms)
        if high < low:
            raise ChaosInvalidFaultError(f"max_ms: must be at least min_ms ({low:g}), got {high:g}")
        return LatencySpec("uniform", None, low, high, None)
    for name, value in (("min_ms", body.min_ms), ("max_ms", body.max_ms)):
        _refuse(name, value, "only for the uniform distribution")
    delay = _required("delay_ms", body.delay_ms)
    if body.distribution == "lognormal":
        return LatencySpec("lognormal", delay, None, None, DEFAULT_SIGMA if body.sigma is None else body.sigma)
    _refuse("sigma", body.sigma, "only for the lognormal distribution")
    return LatencySpec(body.distribution, delay, None, None, None)
