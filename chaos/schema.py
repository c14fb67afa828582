"""Experiment files: YAML parsed into an Experiment, strictly. Every refusal names the field (`method[1].actions[0]
.arm.delay_ms: ...`), and unknown keys are refused, so a typo fails the file instead of silently doing less.

Schema (durations in seconds, rates in requests/s):

    title: str                      # required
    description: str
    tags: [str]
    target:                         # only for the local server started when no --target is given
      model: default | PATH
      serve_args: [str]             # extra `glassbox serve` flags
      startup_timeout_s: float
    load:
      rate: float | "Nx"            # required; "0.5x": half the target's capacity (measured closed-loop first)
      protocol: json | frames
      connections: int
      timeout_s: float
      texts: PATH | TEXTS           # PATH: one text per line, relative to the file; default: built-in mix
                                    # TEXTS: {file: PATH} (one text a line, or JSON lines with "text" and "label"),
                                    #   or {heldout: true} (the local server's model's heldout.jsonl); label: NAME
                                    #   keeps only the texts labelled NAME
      seed: int
      max_outstanding: int
      warmup_s: float               # load at the baseline rate before the baseline phase, not judged
      capacity: {connections: int, duration_s: float}   # how capacity is measured for "Nx" rates
    hypothesis:
      title: str
      p99_ratio_max: float          # P99(fault)/P99(baseline): upper bound of its bootstrap 95% CI
      p99_max_ms: float             # P99(fault): upper bound of its bootstrap 95% CI
      refusal_p99_max_ms: float     # P99 of the fault phase's 429 answers: upper CI bound (and some must occur)
      recovery_p99_ratio_max: float # P99(recovery)/P99(baseline): upper CI bound
      error_budget: {kinds: [ErrorKind], baseline: fraction, fault: fraction, recovery: fraction}
      expect_fallback: bool         # omitted: not judged
      recovery_time_max_s: float
      recovery_window_s: float      # rolling window for the recovery time (default 1)
      recovery_tolerance: float     # back: window P99 <= this x the worst baseline window P99 (default 1.5)
      recovery_slack_ms: float      #   ... + this many ms (default 5)
      drift: {distribution: str, threshold: float, within_s: float}   # glassbox_prediction_drift: at or under the
                                    #   threshold through the baseline, over it within within_s of the fault's
                                    #   start, back at or under it by the end of the recovery
    method:                         # exactly baseline, fault, recovery, in order
      - phase: baseline | fault | recovery
        duration_s: float
        rate: float | "Nx"          # default: load.rate; "Nx" only when load.rate is too
        profile: steady | step | burst
        texts: TEXTS                # fault phase only: what the clients send during it (a shift in the inputs)
        actions:                    # fault phase only
          - arm: {fault: KIND, ttl_s: float, ...params}    # as POST /chaos/faults takes it
          - slow_clients: {connections: int, mode: headers | body | reader, bytes_per_s: float}
    rollbacks: [disarm_faults, stop_slow_clients]         # default: both; they run when the fault phase ends
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import yaml

from glassbox.chaos.experiment import (
    DEFAULT_HYPOTHESIS,
    DEFAULT_TTL_MARGIN_S,
    PHASES,
    ROLLBACKS,
    Action,
    DriftCheck,
    ErrorBudget,
    Experiment,
    ExperimentError,
    Hypothesis,
    Load,
    Phase,
    Profile,
    Protocol,
    SlowClients,
    SlowMode,
    Target,
    Texts,
)
from glassbox.chaos.samples import ERROR_KINDS
from glassbox.chaos.specs import parse_spec
from glassbox.service.errors import ChaosInvalidFaultError


class _Fields:
    """Takes typed fields out of one mapping; `done()` rejects whatever was not taken."""

    def __init__(self, raw: object, where: str) -> None:
        if not isinstance(raw, Mapping):
            raise ExperimentError(f"{where or 'experiment'}: expected a mapping, got {type(raw).__name__}")
        self.raw = raw
        self.where = where
        self.taken: set[str] = set()

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, kinds: tuple[type, ...], default: Any = ..., *, nullable: bool = False) -> Any:
        self.taken.add(key)
        if key not in self.raw:
            if default is ...:
                raise ExperimentError(f"{self.path(key)}: required")
            return default
        value = self.raw[key]
        if value is None and nullable:
            return None
        return _typed(value, kinds, self.path(key))

    def number(self, key: str, default: Any = ..., *, low: float = 0.0, high: float | None = None,
               strict_low: bool = True, nullable: bool = False) -> Any:
        present = key in self.raw
        value = self.get(key, (int, float), default, nullable=nullable)
        if value is None or not present:
            return value
        too_low = value <= low if strict_low else value < low
        if too_low or (high is not None and value > high):
            bound = f"{'>' if strict_low else '>='} {low:g}" + (f" and <= {high:g}" if high is not None else "")
            raise ExperimentError(f"{self.path(key)}: must be {bound}, got {value!r}")
        return float(value)

    def choice(self, key: str, allowed: Sequence[str], default: Any = ...) -> Any:
        value = self.get(key, (str,), default)
        if value not in allowed:
            raise ExperimentError(f"{self.path(key)}: must be one of {', '.join(allowed)}, got {value!r}")
        return value

    def done(self) -> None:
        unknown = sorted(str(k) for k in self.raw if k not in self.taken)
        if unknown:
            raise ExperimentError(f"{self.path(unknown[0])}: unknown key (known: {', '.join(sorted(self.taken))})")


def _typed(value: object, kinds: tuple[type, ...], where: str) -> Any:
    # bool is an int in Python; a YAML `yes` must not pass for a count
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join("number" if k in (int, float) else k.__name__ for k in kinds)
        raise ExperimentError(f"{where}: expected {names}, got {type(value).__name__} {value!r}")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    items = _typed(value, (list,), where)
    return tuple(_typed(item, (str, int, float), f"{where}[{i}]") for i, item in enumerate(items))


def _target(raw: object) -> Target:
    f = _Fields(raw, "target")
    target = Target(model=f.get("model", (str,), "default"),
                    serve_args=tuple(str(a) for a in _strings(f.get("serve_args", (list,), []), "target.serve_args")),
                    startup_timeout_s=f.number("startup_timeout_s", 180.0))
    f.done()
    return target


def _rate(f: _Fields, key: str, default: Any = ...) -> tuple[float | None, bool]:
    """A rate in requests/s, or a multiple of capacity written "3x" (relative): (value, relative)."""
    raw = f.raw.get(key)
    if isinstance(raw, str):
        f.taken.add(key)
        text = raw.strip()
        try:
            value = float(text[:-1]) if text.endswith("x") else float("nan")
        except ValueError:
            value = float("nan")
        if not value > 0:
            raise ExperimentError(f"{f.path(key)}: a rate is requests/s or a positive multiple of capacity such "
                                  f"as 0.5x or 3x, got {raw!r}")
        return value, True
    return f.number(key, default, nullable=default is None), False


def _texts(raw: object, where: str, base: Path) -> Texts:
    if isinstance(raw, str):
        return Texts(file=base / raw)
    f = _Fields(raw, where)
    file = f.get("file", (str,), None, nullable=True)
    heldout = f.get("heldout", (bool,), False)
    label = f.get("label", (str,), None, nullable=True)
    f.done()
    if (file is not None) == heldout:
        raise ExperimentError(f"{where}: give exactly one of file (a path) or heldout: true")
    return Texts(file=None if file is None else base / file, heldout=heldout, label=label)


def _load(raw: object, base: Path) -> Load:
    f = _Fields(raw, "load")
    texts_raw = f.get("texts", (str, dict), None, nullable=True)
    texts = None if texts_raw is None else _texts(texts_raw, f.path("texts"), base)
    rate, relative = _rate(f, "rate")
    capacity = _Fields(f.get("capacity", (dict,), {}), f.path("capacity"))
    connections = int(capacity.number("connections", 32))
    duration = capacity.number("duration_s", 5.0)
    capacity.done()
    assert rate is not None
    load = Load(rate=rate, relative=relative, capacity_connections=connections, capacity_duration_s=duration,
                protocol=f.choice("protocol", get_args(Protocol), "json"),
                connections=int(f.number("connections", 16)), timeout_s=f.number("timeout_s", 10.0),
                texts=texts, seed=f.get("seed", (int,), 0),
                max_outstanding=int(f.number("max_outstanding", 1024)),
                warmup_s=f.number("warmup_s", 0.0, strict_low=False))
    f.done()
    return load


def _budget(raw: object) -> ErrorBudget:
    f = _Fields(raw, "hypothesis.error_budget")
    kinds = _strings(f.get("kinds", (list,), list(ERROR_KINDS)), f.path("kinds"))
    for i, kind in enumerate(kinds):
        if kind not in ERROR_KINDS:
            raise ExperimentError(f"{f.path('kinds')}[{i}]: must be one of {', '.join(ERROR_KINDS)}, got {kind!r}")
    fractions = {p: f.number(p, 0.0, low=0.0, high=1.0, strict_low=False) for p in PHASES}
    f.done()
    return ErrorBudget(kinds=kinds, **fractions)  # type: ignore[arg-type]


def _hypothesis(raw: object) -> Hypothesis:
    f = _Fields(raw, "hypothesis")
    optional = {key: f.number(key, None, nullable=True)
                for key in ("p99_ratio_max", "p99_max_ms", "refusal_p99_max_ms", "recovery_p99_ratio_max",
                            "recovery_time_max_s")}
    drift_raw = f.get("drift", (dict,), None, nullable=True)
    drift = None
    if drift_raw is not None:
        d = _Fields(drift_raw, f.path("drift"))
        drift = DriftCheck(distribution=d.choice("distribution", ("labels", "score", "output", "length"), "labels"),
                           threshold=d.number("threshold", 0.25), within_s=d.number("within_s", 120.0))
        d.done()
    hypothesis = Hypothesis(title=f.get("title", (str,), DEFAULT_HYPOTHESIS), drift=drift,
                            error_budget=_budget(f.get("error_budget", (dict,), {})),
                            expect_fallback=f.get("expect_fallback", (bool,), None, nullable=True),
                            recovery_window_s=f.number("recovery_window_s", 1.0),
                            recovery_tolerance=f.number("recovery_tolerance", 1.5, low=1.0, strict_low=False),
                            recovery_slack_ms=f.number("recovery_slack_ms", 5.0, strict_low=False),
                            **optional)
    f.done()
    return hypothesis


def _arm(raw: object, where: str) -> dict[str, Any]:
    """The fault spec as the control API will receive it, checked by the server's own parser. ttl_s may be left
    out: the runner then gives the fault its phase's duration plus a margin."""
    spec = {str(k): v for k, v in _Fields(raw, where).raw.items()}
    try:
        parse_spec({"ttl_s": DEFAULT_TTL_MARGIN_S, **spec})
    except ChaosInvalidFaultError as exc:
        raise ExperimentError(f"{where}.{exc.message}") from None
    return spec


def _action(raw: object, where: str) -> Action:
    f = _Fields(raw, where)
    if len(f.raw) != 1:
        raise ExperimentError(f"{where}: an action has exactly one key, arm or slow_clients (got {sorted(f.raw)})")
    key = str(next(iter(f.raw)))
    if key not in ("arm", "slow_clients"):
        raise ExperimentError(f"{f.path(key)}: unknown key (an action is arm or slow_clients)")
    if "arm" in f.raw:
        action = Action(arm=_arm(f.get("arm", (dict,)), f.path("arm")))
    else:
        s = _Fields(f.get("slow_clients", (dict,)), f.path("slow_clients"))
        slow = SlowClients(connections=int(s.number("connections")), mode=s.choice("mode", get_args(SlowMode),
                           "headers"), bytes_per_s=s.number("bytes_per_s", 1.0))
        s.done()
        action = Action(slow_clients=slow)
    f.done()
    return action


def _phase(raw: object, index: int, relative: bool, base: Path) -> Phase:
    where = f"method[{index}]"
    f = _Fields(raw, where)
    name = f.choice("phase", PHASES)
    if name != PHASES[index]:
        raise ExperimentError(f"{f.path('phase')}: the method is baseline, fault, recovery in order; got {name!r}")
    actions = _typed(f.get("actions", (list,), []), (list,), f.path("actions"))
    if actions and name != "fault":
        raise ExperimentError(f"{f.path('actions')}: only the fault phase has actions (rollbacks end it)")
    texts_raw = f.get("texts", (str, dict), None, nullable=True)
    if texts_raw is not None and name != "fault":
        raise ExperimentError(f"{f.path('texts')}: only the fault phase sends texts of its own")
    texts = None if texts_raw is None else _texts(texts_raw, f.path("texts"), base)
    rate, rate_relative = _rate(f, "rate", None)
    if rate is not None and rate_relative != relative:
        kind = "multiple of capacity" if relative else "rate in requests/s"
        raise ExperimentError(f"{f.path('rate')}: load.rate is a {kind}; every rate of an experiment must be one")
    phase = Phase(name=name, duration_s=f.number("duration_s"), rate=rate,
                  profile=f.choice("profile", get_args(Profile), "steady"),
                  actions=tuple(_action(a, f"{f.path('actions')}[{i}]") for i, a in enumerate(actions)), texts=texts)
    f.done()
    return phase


def parse_experiment(raw: object, name: str, base: Path = Path()) -> Experiment:
    """An Experiment from parsed YAML; `base` resolves relative paths (the YAML file's directory)."""
    f = _Fields(raw, "")
    method = f.get("method", (list,))
    if len(method) != len(PHASES):
        raise ExperimentError(f"method: expected exactly {len(PHASES)} phases (baseline, fault, recovery), "
                              f"got {len(method)}")
    load = _load(f.get("load", (dict,)), base)
    phases = tuple(_phase(p, i, load.relative, base) for i, p in enumerate(method))
    rollbacks = _strings(f.get("rollbacks", (list,), list(ROLLBACKS)), "rollbacks")
    for i, rollback in enumerate(rollbacks):
        if rollback not in ROLLBACKS:
            raise ExperimentError(f"rollbacks[{i}]: must be one of {', '.join(ROLLBACKS)}, got {rollback!r}")
    experiment = Experiment(
        name=name, title=f.get("title", (str,)), description=f.get("description", (str,), "").strip(),
        load=load, hypothesis=_hypothesis(f.get("hypothesis", (dict,))),
        phases=phases, target=_target(f.get("target", (dict,), {})),  # type: ignore[arg-type]
        tags=_strings(f.get("tags", (list,), []), "tags"), rollbacks=rollbacks,  # type: ignore[arg-type]
    )
    f.done()
    fault = experiment.phase("fault")
    if not fault.actions and fault.texts is None and \
            experiment.rate_of(fault) == experiment.rate_of(experiment.phase("baseline")):
        raise ExperimentError("method[1]: the fault phase needs an action, a rate of its own (overload) or texts of "
                              "its own (a shift in the inputs)")
    return experiment


def load_experiment(path: Path) -> Experiment:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ExperimentError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:  # a ValueError, not an OSError: a binary file named by mistake
        raise ExperimentError(f"cannot read {path}: not UTF-8 text (an experiment is a YAML file)") from None
    except yaml.YAMLError as exc:
        raise ExperimentError(f"{path}: not valid YAML: {exc}") from None
    try:
        return parse_experiment(raw, path.stem, path.parent)
    except ExperimentError as exc:
        raise ExperimentError(f"{path.name}: {exc.message}") from None
