"""One typed settings object, built once (CLI flags over `GLASSBOX_*` environment variables over defaults).

Every field is a CLI flag (`--max-batch-size`) and an environment variable (`GLASSBOX_MAX_BATCH_SIZE`);
the CLI builds its flags from this table so the two can never drift apart.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Device = Literal["auto", "cuda", "cpu"]
Quantize = Literal["none", "int8"]
CpuDtype = Literal["auto", "fp32", "bf16"]
CpuExecutor = Literal["torchscript", "python", "aoti"]
CudaDtype = Literal["fp16", "bf16", "fp32"]
EngineKind = Literal["model", "null"]
OversizePolicy = Literal["truncate", "reject"]
ReadyWhenDegraded = Literal["200", "503"]
OtlpProtocol = Literal["http/protobuf", "grpc"]
LogFormat = Literal["auto", "json", "text"]
LogRequests = Literal["notable", "all", "none"]
ApiKeyScope = Literal["inference", "all"]

ENV_PREFIX = "GLASSBOX_"
# GLASSBOX_* variables that are not settings but are read elsewhere: secrets kept out of flags, the built-in model's
# location, the Makefile's extra serve flags, the test suite's strictness switches, and the user's OMP_NUM_THREADS as
# `glassbox serve` keeps it for its engine threads (service/cores.py sets it in its own environment before it warns).
OTHER_VARIABLES = frozenset({"GLASSBOX_CHAOS_TOKEN", "GLASSBOX_PROFILE_TOKEN", "GLASSBOX_DEFAULT_MODEL_DIR",
                             "GLASSBOX_GRAFANA_TOKEN", "GLASSBOX_ARGS", "GLASSBOX_REQUIRE_DEFAULT_MODEL",
                             "GLASSBOX_REQUIRE_GPU", "GLASSBOX_REQUIRE_TOOLS", "GLASSBOX_USER_OMP_NUM_THREADS"})


def _opt(default: Any, help: str, *, secret: bool = False, **extra: Any) -> Any:
    # A secret never shows in the settings' repr, so no log line or traceback that prints them carries it.
    return field(default=default, repr=not secret, metadata={"help": help, "secret": secret, **extra})


@dataclass(frozen=True, slots=True)
class Settings:
    # model and engine
    model: str = _opt("", "model directory (default: the built-in model)")
    device: Device = _opt("auto", "where the model runs: auto picks cuda when a GPU is usable")
    quantize: Quantize = _opt("none", "CPU only: int8 dynamic quantization of the encoder's Linear layers")
    cpu_dtype: CpuDtype = _opt("auto", "CPU number format: auto picks bf16 where the CPU has it and the model gives "
                                       "the same answers, else fp32")
    cpu_executor: CpuExecutor = _opt("torchscript", "CPU: run the forward pass recorded (torchscript), from Python "
                                                    "(python), or compiled ahead of time (aoti)")
    cuda_dtype: CudaDtype = _opt("fp16", "weights and activations dtype on CUDA")
    cuda_graphs: bool = _opt(True, "replay CUDA graphs on (batch, length) buckets on CUDA")
    debug_graph_buffers: bool = _opt(False, "assert static graph buffers never move (slow; debugging)")
    threads: int = _opt(0, "torch intra-op threads of a batch that runs alone (0: OMP_NUM_THREADS when set, else the "
                           "physical cores)")
    engine_threads: int = _opt(0, "CPU: engine threads running batches side by side (0: 2 on a host with 2 or more "
                                  "cores, 1 on a GPU)")
    engine_nice: int = _opt(5, "raise the engine threads' nice value by this much (Linux; 0: leave it), so the HTTP "
                               "loop runs first")
    seed: int = _opt(0, "seed for every random generator")
    max_length: int = _opt(256, "truncate texts to this many tokens (never above the model's limit)")
    length_buckets: tuple[int, ...] = _opt((16, 32, 64, 128, 256), "sequence-length buckets")
    batch_buckets: tuple[int, ...] = _opt((1, 2, 4, 8, 16, 32, 64), "batch-size buckets")
    cpu_fallback: bool = _opt(True, "keep a warm CPU engine to fall back to when the GPU fails")
    engine: EngineKind = _opt("model", "null: answer fixed logits without running the model, to measure the HTTP "
                                       "front end alone (benchmarks only; needs --benchmark)")
    benchmark: bool = _opt(False, "allow benchmark-only settings (--engine null)")
    # serving
    workers: str = _opt("auto", "HTTP worker processes: 0 serves from one process, N runs N workers and one engine "
                                "process; auto picks")
    host: str = _opt("127.0.0.1", "address to listen on")
    port: int = _opt(8000, "port to listen on")
    keep_alive_timeout_s: int = _opt(75, "close a keep-alive connection after this many idle seconds; keep it above "
                                         "any proxy's idle timeout")
    forwarded_allow_ips: str = _opt("127.0.0.1,::1,::ffff:127.0.0.1", "addresses or networks (CIDR) of the proxies "
                                                                      "whose X-Forwarded-For and -Proto are believed "
                                                                      "('*': any)")
    max_batch_size: int = _opt(32, "most texts in one engine batch")
    max_batch_tokens: int = _opt(4096, "most padded tokens in one engine batch")
    max_batch_time_ms: int = _opt(250, "most time one engine batch may take, predicted from the engine's measured cost"
                                       " (at least one text goes)")
    gc_freeze: bool = _opt(True, "after warm-up, freeze what is alive (gc.freeze) so garbage collections walk only "
                                 "what requests create")
    batch_hold: bool = _opt(True, "let a free engine wait (at most its fixed cost a batch) for a burst that is "
                                  "arriving; off: start at once")
    max_queue_requests: int = _opt(1024, "queued requests before 429")
    max_queue_tokens: int = _opt(262144, "queued tokens before 429")
    max_queue_wait_ms: int = _opt(100, "refuse with 429 a request whose predicted wait in the queue is longer (40% of "
                                       "the 250 ms SLO)")
    shed_window_ms: int = _opt(250, "heavy overload: shed while the wait bound refused as many requests as it admitted"
                                    " this long (0: never)")
    refusals_per_answer: float = _opt(4.0, "429s answered at once a second, per 200 a second, plus 200 a second; the "
                                           "rest held up to 1 s (0: never)")
    max_texts_per_request: int = _opt(256, "texts in one request before 413")
    oversize: OversizePolicy = _opt("truncate", "texts longer than max_length: truncate them or answer 413")
    request_timeout_ms: int = _opt(10000, "default deadline when X-Request-Timeout-Ms is absent")
    header_timeout_s: float = _opt(5.0, "deadline for the complete header block")
    body_timeout_s: float = _opt(30.0, "deadline for the complete body")
    max_header_bytes: int = _opt(16384, "header block size cap (431/413 beyond)")
    max_body_bytes: int = _opt(4 * 1024 * 1024, "body size cap (413 beyond)")
    drain_timeout_s: float = _opt(30.0, "on SIGTERM, how long in-flight work may take to finish")
    exit_when_dead_s: float = _opt(0.0, "once /livez has said dead this long, drain and exit with status 3 (0: stay "
                                        "up)")
    ready_when_degraded: ReadyWhenDegraded = _opt("200", "status of /readyz while on CPU fallback")
    # degradation (GPU -> CPU fallback)
    memory_pressure_high: float = _opt(0.95, "GPU memory used/total above which new batches go to the CPU")
    memory_pressure_low: float = _opt(0.85, "GPU memory used/total below which batches return to the GPU")
    fallback_cooldown_s: float = _opt(1.0, "first wait before a probe batch retries the GPU; doubles on failure, and "
                                           "on a new failure within 60 s of recovering")
    fallback_cooldown_max_s: float = _opt(5.0, "longest wait between GPU probes (a failed probe costs one batch's "
                                               "GPU attempt; a late one keeps a healthy GPU idle)")
    # telemetry
    telemetry: bool = _opt(True, "metrics, traces and request logs (off: the NullObserver, for overhead baselines)")
    otlp_endpoint: str = _opt("", "OTLP endpoint for traces, e.g. http://127.0.0.1:4318 (empty: no export)")
    otlp_protocol: OtlpProtocol = _opt("http/protobuf", "OTLP transport")
    trace_sample_ratio: float = _opt(0.01, "share of the fast answers' traces kept (every 5xx, slow answer and a few "
                                           "429s are kept anyway)")
    trace_refusals_per_s: float = _opt(2.0, "429s a second whose traces are kept (a burst of as many): an overload "
                                            "shows in traces without exporting its flood; 0: none")
    profiling: bool = _opt(False, "profiles on demand: POST /debug/profile (py-spy) and /debug/trace (the torch "
                                  "profiler), behind GLASSBOX_PROFILE_TOKEN")
    profile_token_file: str = _opt("", "read the profile API's token from this file instead of "
                                       "GLASSBOX_PROFILE_TOKEN")
    drift_window_s: float = _opt(60.0, "the window of answers the prediction drift figures compare with the model's "
                                       "reference (glassbox_prediction_drift), in seconds")
    latency_slo_ms: float = _opt(250.0, "the latency SLO threshold: the trace and log line of every slower request "
                                        "are kept")
    log_format: LogFormat = _opt("auto", "log line format; auto: readable text when stderr is a terminal, JSON "
                                          "otherwise (containers, CI, files)")
    log_requests: LogRequests = _opt("notable", "request log lines: notable (errors but 429, slow answers, kept "
                                                "traces), all, or none")
    record_text: bool = _opt(False, "put raw request text into spans and logs (off: never)")
    service_name: str = _opt("glassbox", "service.name resource attribute and log field")
    model_name: str = _opt("", "name served on the KServe v2 routes (default: the model directory's name)")
    # access: TEI's flags. The key is better given as GLASSBOX_API_KEY or a file: a flag's value shows in `ps`.
    api_key: str = _opt("", "require 'Authorization: Bearer KEY' on the inference routes (env only, or --api-key-file: "
                            "a flag would show in ps)", secret=True)
    api_key_file: str = _opt("", "file holding the API key (read once at start-up; one trailing newline ignored)")
    api_key_scope: ApiKeyScope = _opt("inference", "with a key: 'inference' leaves probes and /metrics open, "
                                                   "'all' protects every route")
    cors_allow_origin: str = _opt("", "comma-separated origins browsers may call from ('*': any); empty: no CORS")
    log_level: str = _opt("info", "log level")
    # chaos (staging only): the token itself is never a flag, where `ps` would show it
    chaos: bool = _opt(False, "mount the chaos control API (/chaos/faults); needs a bearer token from "
                              "GLASSBOX_CHAOS_TOKEN or --chaos-token-file")
    chaos_token_file: str = _opt("", "file holding the chaos control API's bearer token (read once at start-up)")

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def field_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(Settings))


def choices_for(name: str) -> tuple[str, ...] | None:
    """The allowed values of a Literal-typed field, else None."""
    annotation = Settings.__annotations__[name]
    literal = globals().get(annotation) if isinstance(annotation, str) else annotation
    args = get_args(literal) if literal is not None else ()
    return tuple(str(a) for a in args) or None


def _field(name: str) -> dataclasses.Field[Any]:
    for f in dataclasses.fields(Settings):
        if f.name == name:
            return f
    raise ValueError(f"unknown setting {name!r} (known: {', '.join(field_names())})")


def _parse(name: str, raw: str, label: str = "") -> Any:
    """One setting from its text form (environment variable or CLI string); errors name the setting (or `label`: the
    variable it came from)."""
    default = _field(name).default
    shown = label or name
    if isinstance(default, bool):
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{shown}: expected a boolean (true/false, 1/0, yes/no, on/off), got {raw!r}")
    try:
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, tuple):
            return parse_int_list(raw)
    except ListError as error:
        raise ValueError(f"{shown}: {error}") from None
    except ValueError:
        kind = "comma-separated integers" if isinstance(default, tuple) else type(default).__name__
        raise ValueError(f"{shown}: expected {kind}, got {raw!r}") from None
    allowed = choices_for(name)
    if allowed is not None and raw not in allowed:
        raise ValueError(f"{shown}: expected one of {', '.join(allowed)}, got {raw!r}")
    return raw


class ListError(ValueError):
    """A list setting's text is not a strictly ascending list of distinct positive integers."""


def parse_int_list(raw: str) -> tuple[int, ...]:
    """`16,32,64` -> (16, 32, 64), strictly: no spaces, no empty parts, positive, distinct and ascending. Lenient
    parsing once turned `"16 32"` into one bucket of 1632; an error now says which part is wrong."""
    if raw == "":
        raise ListError("expected comma-separated positive integers in ascending order, got an empty value")
    parts = raw.split(",")
    values: list[int] = []
    for part in parts:
        if not part.isdigit() or not part.isascii():
            what = "an empty part" if part == "" else f"{part!r}, which is not a positive whole number"
            hint = " (separate values with commas, no spaces)" if " " in part or part == "" else ""
            where = "" if part == raw else f": {what}"  # a one-part value is its own culprit
            raise ListError(f"expected comma-separated positive integers such as 16,32,64, got {raw!r}{where}{hint}")
        value = int(part)
        if value == 0:
            raise ListError(f"got {raw!r}: 0 is not allowed; every value must be positive")
        if value in values:
            raise ListError(f"got {raw!r}: {value} appears twice")
        if values and value < values[-1]:
            raise ListError(f"got {raw!r}: values must be in ascending order ({value} comes after {values[-1]})")
        values.append(value)
    return tuple(values)


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """One warning per `GLASSBOX_*` variable that nothing reads (a typo is otherwise ignored without a word), naming
    the closest known variable."""
    env = os.environ if environ is None else environ
    known = {ENV_PREFIX + name.upper() for name in field_names()} | OTHER_VARIABLES
    warnings = []
    for variable in sorted(env):
        if variable.startswith(ENV_PREFIX) and variable not in known:
            close = difflib.get_close_matches(variable, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else "; `glassbox serve --help` lists the variables"
            warnings.append(f"{variable} is not a glassbox setting and is ignored{hint}")
    return warnings


def sources(environ: Mapping[str, str] | None = None) -> dict[str, tuple[str, str]]:
    """setting -> (its value as text, where it comes from: the `GLASSBOX_*` variable or "default"); what `--help`
    shows, so an overridden default is never presented as the value in effect."""
    env = os.environ if environ is None else environ
    shown: dict[str, tuple[str, str]] = {}
    for spec in dataclasses.fields(Settings):
        variable = ENV_PREFIX + spec.name.upper()
        raw = env.get(variable)
        if raw is not None and raw != "":
            shown[spec.name] = ("(hidden)" if not spec.repr else raw, variable)
        else:
            default = spec.default
            shown[spec.name] = (",".join(map(str, default)) if isinstance(default, tuple) else str(default), "default")
    return shown


def load_settings(
    overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Defaults, then `GLASSBOX_*` variables, then explicit overrides (CLI flags); validated once."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name in field_names():
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None and raw != "":
            values[name] = _parse(name, raw, ENV_PREFIX + name.upper())
    for name, value in (overrides or {}).items():
        _field(name)  # an unknown name is a ValueError that says so, not a TypeError from the constructor
        if value is None:
            continue
        values[name] = _parse(name, value) if isinstance(value, str) else value
    settings = Settings(**values)
    validate(settings)
    return settings


def forwarded_hosts(value: str) -> str:
    """A --forwarded-allow-ips list as uvicorn must be given it: entries stripped, empty ones dropped, and any `*` the
    whole list (uvicorn trusts every peer only for exactly "*": " *" from a ConfigMap would trust nobody)."""
    entries = [part.strip() for part in value.split(",") if part.strip()]
    return "*" if "*" in entries else ",".join(entries)


def _forwarded_problems(value: str) -> list[str]:
    """What is wrong with a --forwarded-allow-ips list. uvicorn would keep an entry it cannot parse as a literal
    that no peer ever matches, so a typo (or a network written with host bits, 10.0.0.1/8) silently trusts nobody."""
    problems = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry or entry == "*":
            continue
        try:
            ipaddress.ip_network(entry) if "/" in entry else ipaddress.ip_address(entry)
        except ValueError as exc:
            problems.append(f"forwarded_allow_ips: {entry!r} is not an IP address or network ({exc})")
    return problems


def validate(settings: Settings) -> None:
    problems: list[str] = []
    # argparse and float() take "nan" and "inf": a NaN passes every comparison below unnoticed (a NaN header timeout
    # left every connection unanswered), and an infinite timeout switches a protection off in silence.
    for spec in dataclasses.fields(Settings):
        value = getattr(settings, spec.name)
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{spec.name} must be a finite number (got {value!r})")
    for name in ("max_length", "max_batch_size", "max_batch_tokens", "max_batch_time_ms", "max_queue_requests",
                 "max_queue_tokens", "max_queue_wait_ms", "max_texts_per_request", "request_timeout_ms",
                 "max_header_bytes", "max_body_bytes", "latency_slo_ms"):
        if getattr(settings, name) <= 0:
            problems.append(f"{name} must be positive")
    for name in field_names():
        allowed = choices_for(name)
        if allowed is not None and getattr(settings, name) not in allowed:
            problems.append(f"{name} must be one of {', '.join(allowed)} (got {getattr(settings, name)!r})")
    if settings.workers != "auto" and not (settings.workers.isdigit() and int(settings.workers) <= 64):
        problems.append(f"workers must be auto or a whole number from 0 to 64 (got {settings.workers!r})")
    if settings.quantize == "int8" and settings.cpu_dtype == "bf16":
        problems.append("quantize int8 and cpu_dtype bf16 exclude each other: int8 computes the encoder's matrix "
                        "products in int8 (pick one)")
    if settings.cpu_executor == "aoti" and settings.cpu_dtype == "bf16":
        problems.append("cpu_executor aoti compiles fp32 models only: use cpu_dtype fp32 or auto with it")
    if settings.engine == "null" and not settings.benchmark:
        problems.append("engine null answers fixed logits and is for benchmarks only: add --benchmark to use it")
    if not 0 <= settings.port <= 65535:
        problems.append(f"port must be 0..65535 (got {settings.port})")
    if not settings.fallback_cooldown_s > 0:
        problems.append("fallback_cooldown_s must be positive")
    elif settings.fallback_cooldown_max_s < settings.fallback_cooldown_s:
        problems.append(f"fallback_cooldown_max_s ({settings.fallback_cooldown_max_s:g}) must be at least "
                        f"fallback_cooldown_s ({settings.fallback_cooldown_s:g}): raise --fallback-cooldown-max-s too")
    if settings.refusals_per_answer < 0:
        problems.append("refusals_per_answer must be 0 (never hold a refusal) or positive")
    if settings.shed_window_ms < 0:
        problems.append("shed_window_ms must be 0 (never shed) or positive")
    if settings.threads < 0:
        problems.append("threads must be 0 (auto) or positive")
    if settings.engine_threads < 0:
        problems.append("engine_threads must be 0 (auto) or positive")
    if not 0 <= settings.engine_nice <= 19:
        problems.append(f"engine_nice must be 0..19 (got {settings.engine_nice})")
    for name in ("length_buckets", "batch_buckets"):
        buckets = getattr(settings, name)
        if not buckets or any(b <= 0 for b in buckets):
            problems.append(f"{name} must be a non-empty list of positive integers")
    if not 1 <= settings.keep_alive_timeout_s <= 86400:
        problems.append(f"keep_alive_timeout_s must be 1..86400 seconds (got {settings.keep_alive_timeout_s})")
    problems.extend(_forwarded_problems(settings.forwarded_allow_ips))
    if "/" in settings.model_name:
        # The /v2 routes take the name as one path segment, and a client cannot escape the slash (tritonclient leaves
        # it as it is, and %2F arrives decoded): every /v2/models route would answer 404 for the model served.
        problems.append(f"model_name must not contain '/' (got {settings.model_name!r}): the KServe v2 routes take it "
                        "as one path segment")
    for name in ("header_timeout_s", "body_timeout_s", "drain_timeout_s"):
        if getattr(settings, name) <= 0:
            problems.append(f"{name} must be positive")
    if not 0 < settings.memory_pressure_low < settings.memory_pressure_high <= 1:
        problems.append("memory_pressure_low must be below memory_pressure_high, both in (0, 1]")
    if not settings.exit_when_dead_s >= 0:
        problems.append("exit_when_dead_s must be 0 (never) or positive")
    if not 0 <= settings.trace_sample_ratio <= 1:
        problems.append("trace_sample_ratio must be in [0, 1]")
    if not 5.0 <= settings.drift_window_s <= 3600.0:
        problems.append(f"drift_window_s must be 5..3600 seconds (got {settings.drift_window_s:g})")
    if settings.trace_refusals_per_s < 0:
        problems.append("trace_refusals_per_s must be 0 (keep no 429's trace for itself) or positive")
    if problems:
        raise ValueError("invalid settings: " + "; ".join(problems))
