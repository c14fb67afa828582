"""The commands the README and docs/ show run as written.

Every ```sh or ```bash block in README.md and docs/ is either run here, against a real `glassbox serve` (the tiny
test model on a free port, started with --chaos), or listed in CANNOT_RUN with the reason. A run block runs
verbatim in bash, with these substitutions only: the documented address (localhost:8000, 127.0.0.1:8000) becomes
the test server's; a line that starts the server (`make run &`, `glassbox serve ...`) is left out, since the test's
server is already up; the chaos token the docs generate is the one the test's server was started with. A block
passes when it exits 0 and prints no error body, unless it is in SHOWS_AN_ERROR.

Also here: the headers the README promises per route, and that no link in the docs leaves the repository except
for a public URL.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TOKEN = "doc-test-chaos-token-0123456789"
BOUND_S = 60.0

# (file, the block's first command line, up to its comment) -> why it cannot run in this test.
CANNOT_RUN = {
    ("README.md", "make run"): "sets up .venv and fine-tunes the default model (minutes); CI runs `make test`",
    ("docs/chaos.md", "glassbox chaos slow-clients --target http://127.0.0.1:8000 --mode headers --connections 200 "
                      "--rate 1 --duration 30"):
        "a 30 s attack; tests/chaos/test_slowclients.py runs the same command for a second",
    ("docs/chaos.md", "glassbox bench --target http://127.0.0.1:8000 --rate 100 --duration 30 [--profile "
                      "steady|step|burst] \\"): "a synopsis: the bracketed options are alternatives",
    ("docs/chaos.md", "glassbox chaos run oom-fallback"): "needs the built-in default model and about 70 s; "
                                                          "tests/chaos/test_run_experiments.py runs experiments",
    ("docs/deploy.md", "docker build -t glassbox:cuda ."): "needs docker and network access",
    ("docs/deploy.md", "promtool check rules deploy/prometheus/rules/*.yml"):
        "tests/deploy runs these three commands already (test_prometheus.py: check rules, test rules; "
        "test_alertmanager.py: check-config), and promtool's unit tests take 15 s",
    ("docs/deploy.md", "kubectl apply -k deploy/k8s"): "needs a Kubernetes cluster; tests/deploy validates the "
                                                      "manifests",
    ("docs/benchmarks/2026-12-07-bf16.md", ".venv/bin/python -m benchmarks.cpu_dtypes --rounds 3 --served-rounds 4 "
                                           "--json cpu-dtypes.json"):
        "minutes of benchmarks on the built-in model; tests/benchmarks/test_cpu_dtypes.py runs a short one",
    ("docs/gpu-check.md", "make test"): "needs an NVIDIA GPU host",
    ("docs/gpu-check.md", "scripts/gpu-check.sh --json PATH"): "needs an NVIDIA GPU host",
    ("docs/gpu-check.md", "PYTHONPATH=. .venv/bin/python -m benchmarks.gpu_check prepare-carry [--model DIR] "
                          "[--dest out/gpu-carry] [--serve-deps]"): "a synopsis; tests/benchmarks/test_gpu_check.py "
                                                                    "runs prepare-carry",
    ("docs/gpu-check.md", "scripts/gpu-serving.sh"): "needs a GPU host (about 4 minutes); "
                                                     "tests/benchmarks/test_gpu_serving.py runs its CPU rehearsal",
    ("docs/gpu-check.md", "scripts/gpu-check.sh --cpu-rehearsal --json OUT"):
        "minutes of CPU; tests/benchmarks/test_gpu_check.py runs the rehearsal's checks",
    ("docs/models.md", "glassbox model convert served"): "needs a directory holding pytorch_model.bin; "
                                                        "tests/service/model/test_convert.py converts one",
    ("docs/models.md", "glassbox model reference served --texts recent-traffic.jsonl"):
        "needs the served directory and a file of the user's texts; tests/service/model/test_reference.py runs it",
    ("docs/quickstart.md", "docker compose --profile cpu up --build -d"): "needs docker (the compose stack)",
    ("docs/quickstart.md", "for i in $(seq 1 3000); do"): "3000 requests of load for the dashboards",
    ("docs/quickstart.md", "export GLASSBOX_CHAOS=true GLASSBOX_CHAOS_TOKEN=$(openssl rand -hex 16)"):
        "restarts the compose stack with docker",
    ("docs/quickstart.md", "docker compose exec glassbox-cpu glassbox chaos run oom-fallback \\"): "needs docker",
    ("docs/quickstart.md", "seq 1 4000 | xargs -P 64 -I{} curl -s -o /dev/null -w '%{http_code}\\n' "
                           "localhost:8000/v1/classify \\"): "4000 requests of load against a shrunk queue",
    ("docs/quickstart.md", "docker compose --profile cpu down"): "needs docker",
    ("docs/runbook.md", 'curl -H "Authorization: Bearer $GLASSBOX_CHAOS_TOKEN" http://REPLICA:8000/chaos/faults'):
        "REPLICA stands for one replica's address in a cluster",
}
# Blocks whose point is to show an error answer.
SHOWS_AN_ERROR = {("docs/quickstart.md", "exec 3<>/dev/tcp/127.0.0.1/8000; printf 'POST /v1/classify "
                                         "HTTP/1.1\\r\\nHost: localhost\\r\\n' >&3")}
SERVER_LINE = re.compile(r"^(make run &|glassbox serve( --chaos| --model served)?( &)?)(\s+#.*)?$")
TOKEN_LINE = re.compile(r"^export GLASSBOX_CHAOS_TOKEN=\$\(openssl rand -hex \d+\)(\s+#.*)?$")


@dataclass(frozen=True)
class Block:
    file: str
    line: int
    text: str

    @property
    def key(self) -> tuple[str, str]:
        first = next(line for line in self.text.splitlines() if line.strip() and not line.startswith("#"))
        return self.file, re.sub(r"\s+#.*$", "", first).strip()


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"^```(sh|bash)\n(.*?)^```", text, re.S | re.M):
            found.append(Block(str(path.relative_to(ROOT)), text[:match.start()].count("\n") + 1, match.group(2)))
    return found


BLOCKS = blocks()
RUNNABLE = [block for block in BLOCKS if block.key not in CANNOT_RUN]


def test_every_block_is_run_or_listed_with_a_reason() -> None:
    keys = {block.key for block in BLOCKS}
    assert not set(CANNOT_RUN) - keys, f"CANNOT_RUN lists blocks the docs no longer have: {set(CANNOT_RUN) - keys}"
    assert len(RUNNABLE) >= 10


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Server:
    port: int
    bin: Path


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`glassbox serve` as a user starts it, from this checkout, with `glassbox` on PATH for the blocks."""
    bin_dir = tmp_path_factory.mktemp("bin")
    shim = bin_dir / "glassbox"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m glassbox.service "$@"\n')
    shim.chmod(0o755)
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")}, "GLASSBOX_CHAOS_TOKEN": TOKEN,
           "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "glassbox.service", "serve", "--model", str(tiny_model_dir), "--device", "cpu",
               "--port", str(port), "--chaos", "--workers", "0", "--threads", "1", "--max-length", "32",
               "--length-buckets", "16,32", "--batch-buckets", "1,4,8", "--log-level", "warning"]
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + BOUND_S
        while True:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.1)  # a poll step, bounded by the deadline above
        yield Server(port, bin_dir)
    finally:
        process.terminate()
        process.wait(BOUND_S)


def as_run(block: Block, port: int) -> str:
    lines = []
    for line in block.text.splitlines():
        if SERVER_LINE.match(line):
            line = ": the test server is already running"
        elif TOKEN_LINE.match(line):
            line = f"export GLASSBOX_CHAOS_TOKEN={TOKEN}"
        lines.append(line.replace("localhost:8000", f"127.0.0.1:{port}").replace("127.0.0.1:8000", f"127.0.0.1:{port}")
                     .replace("/dev/tcp/127.0.0.1/8000", f"/dev/tcp/127.0.0.1/{port}"))
    return "set -euo pipefail\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"{b.file}:{b.line}" for b in RUNNABLE])
def test_the_block_runs_as_written(block: Block, server: Server, tiny_model_dir: Path, tmp_path: Path) -> None:
    if block.file == "docs/deploy.md" and shutil.which("promtool") is None:
        pytest.skip("promtool is not installed")
    if block.file == "docs/models.md":  # the user's own fine-tuned model, as save_pretrained wrote it
        shutil.copytree(tiny_model_dir, tmp_path / "my-finetuned")
    cwd = ROOT if block.file == "docs/deploy.md" else tmp_path
    env = {**os.environ, "PATH": f"{server.bin}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "GLASSBOX_CHAOS_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", "-c", as_run(block, server.port)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    shows_error = '"error"' in done.stdout or "HTTP/1.1 4" in done.stdout or "HTTP/1.1 5" in done.stdout
    assert shows_error == (block.key in SHOWS_AN_ERROR), done.stdout


# --- what the README promises ---------------------------------------------------------------------------------------
INFERENCE = [("POST", "/v1/classify", {"text": "a good film"}), ("POST", "/predict", {"inputs": "a good film"}),
             ("POST", "/", {"inputs": "a good film"}), ("POST", "/invocations", {"inputs": "a good film"})]


@pytest.mark.parametrize(("method", "path", "body"), INFERENCE, ids=[p for _, p, _ in INFERENCE])
def test_inference_answers_carry_the_timing_headers(server: Server, method: str, path: str,
                                                    body: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{server.port}{path}"
    served = httpx.request(method, url, json=body, timeout=BOUND_S)
    assert served.status_code == 200
    assert {"x-request-id", "x-latency-ms", "server-timing"} <= set(served.headers)
    refused = httpx.request(method, url, content=b"{not json", headers={"content-type": "application/json"},
                            timeout=BOUND_S)
    assert 400 <= refused.status_code < 500
    assert {"x-request-id", "x-latency-ms"} <= set(refused.headers)


def test_the_v2_infer_answer_carries_the_timing_headers(server: Server, tiny_model_dir: Path) -> None:
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a good film"]}]}
    answer = httpx.post(f"http://127.0.0.1:{server.port}/v2/models/{tiny_model_dir.name}/infer", json=body,
                        timeout=BOUND_S)
    assert answer.status_code == 200
    assert {"x-request-id", "x-latency-ms", "server-timing"} <= set(answer.headers)


# --- links -----------------------------------------------------------------------------------------------------------
LINK = re.compile(r"\]\(([^)\s]+)\)")
PUBLIC = re.compile(r"^https?://(?!localhost|127\.|0\.0\.0\.0|\[::1\]|REPLICA)[a-z0-9.-]+\.[a-z]{2,}(/|$)", re.I)


@pytest.mark.parametrize("path", [*DOCS, ROOT / "examples" / "README.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_in_the_repository_or_are_public(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    for target in LINK.findall(text):
        if target.startswith("#") or target.startswith("mailto:"):
            continue
        if "://" in target:
            assert PUBLIC.match(target), f"{path.name}: {target} is not a public URL"
            continue
        resolved = (path.parent / target.split("#", 1)[0]).resolve()
        assert resolved.is_relative_to(ROOT), f"{path.name}: {target} leaves the repository"
        assert resolved.exists(), f"{path.name}: {target} does not exist"
    # Paths in backticks too: a user has the repository, not what lies beside it.
    assert not re.search(r"`\.\./", text), f"{path.name} points outside the repository"


# --- the README's table of commands ----------------------------------------------------------------------------------
PLACEHOLDERS = {"DIR": "some-dir", "N": "2", "F": "key-file", "URL": "http://127.0.0.1:9", "R": "5", "S": "1"}


def table_commands() -> list[str]:
    return re.findall(r"^\| `(glassbox[^`]*)` \|", (ROOT / "README.md").read_text(encoding="utf-8"), re.M)


def argv_of(command: str) -> list[str]:
    """The words of a synopsis: optional parts included, the first of alternatives, placeholders filled in."""
    text = command.replace("\\|", "|").replace(" ...", "")
    text = re.sub(r"\[([^\]]*)\]", lambda part: part.group(1), text)
    text = re.sub(r"([^\s|]+)(\|[^\s|]+)+", lambda choice: choice.group(1), text)
    return [PLACEHOLDERS.get(word, word) for word in text.split()[1:]]


@pytest.mark.parametrize("command", table_commands())
def test_every_command_in_the_readme_table_parses(command: str) -> None:
    from glassbox.service.cli import build_parser, named_command

    argv = argv_of(command)
    if argv == ["--version"]:
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args(argv)
        assert done.value.code == 0
        return
    args = build_parser(named_command(argv)).parse_args(argv)  # a flag that does not exist exits 2 here
    assert callable(args._run)
    if argv[:2] == ["chaos", "slow-clients"]:  # its required options are checked after parsing
        from glassbox.chaos.cli.slow_clients import config_from_args

        config_from_args(args)
    if argv == ["bench", *argv[1:]] and "engine" not in argv:
        from glassbox.chaos.cli.bench import config_from_args as bench_config

        bench_config(args)


def test_the_table_is_read() -> None:
    commands = table_commands()
    assert len(commands) >= 12 and "glassbox --version" in commands
    assert argv_of("glassbox serve [--model DIR] [--device auto\\|cuda\\|cpu] ...") == [
        "serve", "--model", "some-dir", "--device", "auto"]
