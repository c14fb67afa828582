"""How the settings are presented to people: the groups `glassbox serve --help` and docs/settings.md show them in,
and the details a flag's one-line help leaves out (docs/settings.md prints them under the flag). The settings
themselves, their defaults and their checks are service/settings.py."""

from __future__ import annotations

# What a flag's one-line help leaves out: docs/settings.md shows it under the flag.
DETAILS: dict[str, str] = {
    "profiling": ("/debug/profile answers a speedscope profile of every thread of every glassbox process; /debug/trace "
                  "a Chrome trace of the engine's operators (docs/api.md, Profile API)."),
    "latency_slo_ms": "The Prometheus recording rules judge requests at 250 ms too: change both.",
    "cpu_dtype": (
        "auto picks bf16 where the CPU has amx_bf16 or avx512_bf16 and the model's heldout.jsonl gets the "
        "same answers as in fp32 (at least 99.5% agreement; docs/models.md), else fp32."
    ),
    "cpu_executor": "aoti compiles with torch.export and AOTInductor: it needs a C++ compiler and ~30 s at start.",
    "threads": "The threads are shared out among the engine threads when batches run side by side.",
    "engine_nice": (
        "When cores are short the HTTP event loop then runs first: refusals and answers wait less for a core,"
        " at the same throughput."
    ),
    "workers": (
        "0 runs the engine on a thread beside the HTTP loop; N >= 1 runs N workers and one engine process "
        "under a supervisor. auto: 0 on a CPU host with <= 4 cores, 1 per 8 cores on a larger CPU host, on a "
        "GPU host 1 per 2 cores between 2 and 8 (docs/api.md, Processes)."
    ),
    "keep_alive_timeout_s": (
        "Keep it above the idle timeout of any proxy or load balancer in front (60 s for AWS ALB and "
        "ingress-nginx; 600 s for Google Cloud's, so 620 there), or the proxy may send a request on a "
        "connection this server is closing and answer 502."
    ),
    "forwarded_allow_ips": (
        "Comma-separated. What they say becomes the client address and scheme in traces. The default is a "
        "proxy on this host: IPv4, IPv6, or IPv4 through an IPv6 listener."
    ),
    "max_batch_time_ms": (
        "Texts beyond that wait for the next batch. 250 ms is the latency SLO: no request rides in a batch "
        "longer than the SLO it is held to (150 ms also cut closed-loop batches, at a cost in throughput)."
    ),
    "gc_freeze": (
        "Off: a full collection walks the model and the libraries, a pause of ~0.1 s every few seconds under "
        "load."
    ),
    "batch_hold": "The requests of the burst then share one batch.",
    "max_queue_wait_ms": (
        "The wait is predicted from the queued tokens at the engine's measured rate. While shedding heavy "
        "overload a third of it bounds the wait and two thirds cap the batch."
    ),
    "shed_window_ms": (
        "While shedding, a third of --max-queue-wait-ms bounds the wait, two thirds cap the batch, and the "
        "floor is one batch queued. Clients that send again as soon as a 429 comes back, without waiting for "
        "its Retry-After, keep a server that sheds shedding: 64 of them in a closed loop cut what a 2-core "
        "host served by a third (docs/runbook.md, Overload)."
    ),
    "refusals_per_answer": (
        "Each HTTP process holds the refusals past that in turn, at most 1 s, so that clients that send again"
        " as soon as a 429 comes back slow down instead of taking the engine's CPU (open-loop overload at 3x "
        "capacity refuses ~3 per answer)."
    ),
    "exit_when_dead_s": (
        "For process managers that restart a process that exits but not one that fails a health check "
        "(Docker's restart policies, systemd); Kubernetes restarts on its liveness probe, so 0 suits it."
    ),
    "trace_sample_ratio": (
        "Applies when no sampled parent asked for the trace: every 5xx, every request slower than "
        "--latency-slo-ms and 429s up to --trace-refusals-per-s are kept whatever it says (docs/metrics.md)."
    ),
    "log_requests": "A line costs ~100-140 us of CPU on a 2-core host (docs/metrics.md).",
}

# How `glassbox serve --help` and docs/settings.md group the settings: (title, what the group is about, its fields).
GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("model and device", "which model runs where, in which number format, on how many threads",
     ("model", "model_name", "device", "quantize", "cpu_dtype", "cpu_executor", "cuda_dtype", "cuda_graphs",
      "debug_graph_buffers", "threads", "engine_threads", "engine_nice", "seed", "max_length", "length_buckets",
      "batch_buckets", "engine", "benchmark")),
    ("batching and admission", "how texts are batched, and when a request waits or is refused with 429",
     ("max_batch_size", "max_batch_tokens", "max_batch_time_ms", "batch_hold", "max_queue_requests",
      "max_queue_tokens", "max_queue_wait_ms", "shed_window_ms", "refusals_per_answer", "request_timeout_ms")),
    ("GPU fallback", "when batches move from the GPU to the warm CPU engine, and back",
     ("cpu_fallback", "memory_pressure_high", "memory_pressure_low", "fallback_cooldown_s", "fallback_cooldown_max_s",
      "ready_when_degraded")),
    ("HTTP and limits", "where the server listens, what a request may hold, and who may call it",
     ("host", "port", "keep_alive_timeout_s", "forwarded_allow_ips", "max_texts_per_request", "oversize",
      "header_timeout_s", "body_timeout_s", "max_header_bytes", "max_body_bytes", "api_key", "api_key_file",
      "api_key_scope", "cors_allow_origin")),
    ("processes", "one process or workers, start, drain and exit",
     ("workers", "gc_freeze", "drain_timeout_s", "exit_when_dead_s")),
    ("telemetry", "metrics, traces, request logs and the prediction drift figure",
     ("telemetry", "otlp_endpoint", "otlp_protocol", "trace_sample_ratio", "trace_refusals_per_s", "latency_slo_ms",
      "drift_window_s", "log_level", "log_format", "log_requests", "record_text", "service_name")),
    ("chaos and profiling", "staging tools, each behind its own token: fault injection, profiles on demand",
     ("chaos", "chaos_token_file", "profiling", "profile_token_file")),
)
