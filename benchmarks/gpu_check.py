"""The GPU check: every GPU-only path of glassbox as a named check (gpu_check_book.CATALOGUE), plus what capture
costs and how much faster graphs are.

    PYTHONPATH=.pythonpath:. python -m benchmarks.gpu_check [--model DIR] [--json PATH] [--cpu-rehearsal]
    PYTHONPATH=.pythonpath:. python -m benchmarks.gpu_check prepare-carry --model DIR [--dest out/gpu-carry]

`scripts/gpu-check.sh` is the one command that wraps it; docs/gpu-check.md explains both. Exit codes:
0 no check failed, 1 a check failed, 2 no CUDA device (nothing was measured). The JSON's "checks" names every
check with its status: passed, failed, needs-gpu (on a CPU rehearsal) or skipped.

Runs on the bare GPU machine with `PYTHONPATH=.pythonpath:.`: it must import nothing beyond torch, numpy, tokenizers,
safetensors and the standard library (checked at start, see FORBIDDEN_MODULES).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check_book import CheckBook
from benchmarks.gpu_check_carry import DEFAULT_DEST, prepare, unpack_wheels
from benchmarks.gpu_check_device import nvml_lookup, oom_classify
from benchmarks.gpu_check_measure import Plan, measure, record_bert_base
from benchmarks.gpu_check_oom import describe as describe_oom
from benchmarks.gpu_check_oom import oom_check
from benchmarks.gpu_check_oom_rigs import GPU_MODEL
from benchmarks.gpu_check_paths import run_paths
from benchmarks.gpu_check_serve import serve_check
from glassbox.service.buckets import BucketTable
from glassbox.service.engines.factory import bucket_table
from glassbox.service.engines.graph_capture import EagerRehearsalCapturer
from glassbox.service.model.bert import BertClassifier
from glassbox.service.model.config import ModelConfig, parse_config
from glassbox.service.model.default import default_model_dir
from glassbox.service.model.files import TOKENIZER_FILE
from glassbox.service.model.loader import load_model, save_model
from glassbox.service.settings import Settings

FORBIDDEN_MODULES = ("starlette", "msgspec", "uvicorn", "opentelemetry", "rich")
# Files that hold gpu-marked tests.
GPU_TEST_FILES = ("tests/service/engines/test_graphs.py", "tests/service/engines/test_graph_capture.py",
                  "tests/chaos/test_gpu.py")
PYTEST_TIMEOUT_S = 240
CARRIED_WHEELS = Path("out/gpu-carry/wheels")  # prepare-carry --serve-deps: the e2e server's dependencies

BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
             "vocab_size": 30522}
REHEARSAL_STAND_IN = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "intermediate_size": 128, "vocab_size": 2000}


def random_config(dims: dict[str, int]) -> ModelConfig:
    raw = {"model_type": "bert", "architectures": ["BertForSequenceClassification"], "max_position_embeddings": 512,
           "type_vocab_size": 2, "id2label": {"0": "negative", "1": "positive"}, **dims}
    return parse_config(raw, source="gpu-check random model")


def random_model(dims: dict[str, int], seed: int = 0) -> BertClassifier:
    model = BertClassifier(random_config(dims))
    model.init_weights(torch.Generator().manual_seed(seed), std=0.02)
    return model.eval()


def carried_wheels_fit() -> bool:
    """Whether prepare-carry --serve-deps left wheels here, built for this interpreter's Python version."""
    manifest = CARRIED_WHEELS / "CARRIED.json"
    if not manifest.is_file():
        return False
    python = json.loads(manifest.read_text(encoding="utf-8")).get("python")
    if python != f"{sys.version_info.major}.{sys.version_info.minor}":
        print(f"gpu-check: {CARRIED_WHEELS} holds wheels for Python {python}, not this one: not used")
        return False
    return True


def serve_model_dir(args: argparse.Namespace, dest: Path) -> Path:
    """A model directory for the end-to-end server: BERT-base-sized random weights (the stand-in on a rehearsal)
    with the checked model's tokenizer, or a letters-only WordPiece tokenizer when there is no model here."""
    source = Path(args.model) if args.model else default_model_dir()
    tokenizer_file = source / TOKENIZER_FILE
    tokenizer_json = tokenizer_file.read_text(encoding="utf-8") if tokenizer_file.is_file() else letters_tokenizer()
    from tokenizers import Tokenizer

    dims = dict(REHEARSAL_STAND_IN if args.cpu_rehearsal else BERT_BASE)
    dims["vocab_size"] = max(dims["vocab_size"], Tokenizer.from_str(tokenizer_json).get_vocab_size())
    save_model(dest, random_model(dims), tokenizer_json)
    return dest


def letters_tokenizer() -> str:
    """BERT-style WordPiece over letters and digits: every word tokenizes, one piece per character after the first."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789")
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars), *".,!?'-"]
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return tokenizer.to_str()


def check_imports() -> list[str]:
    """Which forbidden modules this script's import closure pulls in, read in a fresh interpreter (the calling
    process, a test run say, may have imported them for its own reasons)."""
    probe = (
        "import sys, benchmarks.gpu_check as g; "
        "print(' '.join(n for n in g.FORBIDDEN_MODULES if n in sys.modules))"
    )
    root = str(Path(__file__).resolve().parent.parent)
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root, check=True)
    return found.stdout.split()


def environment(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "torch_cuda": torch.version.cuda, "device": device}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_bytes=props.total_memory)
    else:
        info.update(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return info


def model_specs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """What to measure: the default (or given) model when there is one, and a random model of BERT-base size."""
    specs: list[dict[str, Any]] = []
    chosen = Path(args.model) if args.model else default_model_dir()
    if (chosen / "model.safetensors").is_file():
        specs.append({"name": "default-model", "source": str(chosen), "load": lambda: load_model(chosen).model})
    else:
        why = "no --model given and the built-in default model is not built here" if not args.model \
            else f"{chosen} has no model.safetensors"
        specs.append({"name": "default-model", "source": str(chosen), "skipped": why})
    if args.cpu_rehearsal:
        specs.append({"name": "bert-mini-random (rehearsal stand-in for bert-base)", "source": "random",
                      "load": lambda: random_model(REHEARSAL_STAND_IN), "bert_base": True})
    else:
        specs.append({"name": "bert-base-random", "source": "random", "load": lambda: random_model(BERT_BASE),
                      "bert_base": True})
    return specs


def run_pytest(rehearsal: bool) -> dict[str, Any]:
    """The gpu-marked tests, in a child process. --noconftest: the test files build their own fixtures, and
    a conftest elsewhere in tests/ may import what this machine lacks."""
    if importlib.util.find_spec("pytest") is None:
        return {"status": "skipped", "pass": False,
                "reason": "pytest is not importable: carry out/gpu-carry/pydeps.zip (docs/gpu-check.md)"}
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "--noconftest", "-p", "no:cacheprovider",
               *GPU_TEST_FILES]
    # No plugin autoload: a stray plugin installed on the machine (or its missing dependencies) must not
    # decide whether the check runs; these tests need none.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PYTEST_TIMEOUT_S, check=False,
                              env=env)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "pass": False, "command": " ".join(command)}
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else done.stderr.strip()[-500:]
    # On a GPU nothing may skip: a skip there means the tests did not see the device.
    ok = done.returncode == 0 and (rehearsal or "skipped" not in summary)
    return {"status": "ran", "pass": ok, "returncode": done.returncode, "summary": summary,
            "command": " ".join(command), "output_tail": done.stdout[-3000:]}


class Results:
    """The JSON document, rewritten after every step so a run cut short still leaves what it measured."""

    def __init__(self, path: Path | None, mode: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"check": "glassbox gpu-check", "mode": mode,
                                     "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}

    def save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.data, indent=2) + "\n", encoding="utf-8")


def plan_for(args: argparse.Namespace) -> tuple[str, Plan]:
    if args.cpu_rehearsal:
        # Small on purpose: the point is to exercise every step of the script, not to measure the CPU.
        table = BucketTable(batches=(1, 4, 32), lengths=(16, 128))
        return "cpu", Plan("cpu", table, iterations=args.iterations or 10, warm_runs=2)
    # The server's own default buckets, so capture time and pool size are what `glassbox serve` would see.
    return "cuda:0", Plan("cuda:0", bucket_table(Settings(), 256), iterations=args.iterations or 200, warm_runs=20)


def paths_plan(args: argparse.Namespace, plan: Plan) -> tuple[BertClassifier, Plan]:
    """The serving-shape checks run a smaller table (12 graphs on a GPU) on a MiniLM-sized random model: they are
    about behaviour, and each captures its own engine."""
    if args.cpu_rehearsal:
        return random_model(REHEARSAL_STAND_IN), plan
    return random_model(GPU_MODEL), Plan(plan.device, BucketTable((1, 2, 8, 32), (16, 64, 256)), 0, 0)


def fmt_bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def print_run(name: str, run: dict[str, Any]) -> None:
    if "error" in run:
        print(f"  {name} {run['dtype']}: ERROR {run['error']}")
        return
    parity = run["parity"]
    print(f"  {name} {run['dtype']} [{run['kind']}]: {run['buckets']} buckets captured in {run['capture_s']:.2f}s, "
          f"pool {fmt_bytes(run['graph_pool_reserved_bytes'])} reserved / "
          f"{fmt_bytes(run['graph_pool_allocated_bytes'])} held; SDPA {run['sdpa_backend']}")
    print(f"    parity exact {'PASS' if parity['exact'] else 'FAIL'}, cross-path "
          f"{'PASS' if parity['cross_path'] else 'FAIL'} (max |graph - eager| logits "
          f"{max(r['max_abs_diff_logits'] for r in parity['shapes']):.3g})")
    for row in run["latency"]:
        g, e = row["graph"], row["eager"]
        print(f"    {row['batch']:>2}x{row['length']}: graph p50 {g['p50_ms']:.3f} ms p99 {g['p99_ms']:.3f} ms | "
              f"eager p50 {e['p50_ms']:.3f} ms p99 {e['p99_ms']:.3f} ms | x{row['speedup_p50']:.2f} at p50")
    fallback = run["fallback"]
    print(f"    overflow {'PASS' if fallback['pass'] else 'FAIL'}: {fallback['texts']} texts ran {fallback['mode']}, "
          f"counted {fallback['counted']}")


def run_check(args: argparse.Namespace) -> int:
    threads = torch.get_num_threads()
    if args.cpu_rehearsal:
        torch.set_num_threads(1)  # tiny models on shared cores: thread hand-off would dominate, and neighbours suffer
    try:
        return _run_check(args)
    finally:
        torch.set_num_threads(threads)


def _run_check(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    leaked = check_imports()
    if leaked:
        print(f"gpu-check: imports {', '.join(leaked)}, which the GPU machine lacks; fix the import chain",
              file=sys.stderr)
        return 1
    if not args.cpu_rehearsal and not torch.cuda.is_available():
        print(f"gpu-check: no CUDA device visible to torch {torch.__version__} (CUDA build: {torch.version.cuda}); "
              "nothing was measured. Use --cpu-rehearsal to rehearse the script on the CPU.", file=sys.stderr)
        return 2
    device, plan = plan_for(args)
    json_path = Path(args.json) if args.json else (Path(os.environ["OUT"]) / "gpu-check.json"
                                                     if os.environ.get("OUT") else None)
    results = Results(json_path, "cpu-rehearsal" if args.cpu_rehearsal else "gpu")
    results.data["environment"] = environment(device)
    results.data["buckets"] = [str(b) for b in plan.table.all()]
    results.data["models"] = []
    if args.cpu_rehearsal:
        print("gpu-check: CPU REHEARSAL: graphs are replayed by the eager stand-in capturer; no CUDA graph is "
              "captured and no figure below says anything about a GPU")
    print(f"gpu-check on {device} ({results.data['environment'].get('gpu', 'cpu')}), "
          f"{len(plan.table.all())} buckets, {plan.iterations} timed runs per shape")
    book = CheckBook(rehearsal=args.cpu_rehearsal)

    def save() -> None:
        results.data["checks"] = book.to_json()
        results.save()

    for spec in model_specs(args):
        entry: dict[str, Any] = {"name": spec["name"], "source": spec["source"]}
        results.data["models"].append(entry)
        if "skipped" in spec:
            entry["skipped"] = spec["skipped"]
            print(f"  {spec['name']}: SKIPPED ({spec['skipped']})")
            continue
        model = spec["load"]()
        entry["parameters"] = sum(p.numel() for p in model.parameters())
        entry["runs"] = []
        for dtype in ("fp32", "fp16"):
            capturer = EagerRehearsalCapturer() if args.cpu_rehearsal else None  # None: real CUDA graphs
            throughput = bool(spec.get("bert_base")) and dtype == "fp16"
            try:
                run = measure(model, dtype, plan, capturer, book, spec["name"], throughput=throughput)
            except Exception as exc:  # kept in the JSON; the checks this run feeds fail with it
                run = {"dtype": dtype, "error": f"{type(exc).__name__}: {exc}"[:500]}
                book.error("graph_parity_exact", exc, model=spec["name"], dtype=dtype)
            entry["runs"].append(run)
            if throughput:
                record_bert_base(book, run, spec["name"])
            print_run(spec["name"], run)
            save()
        del model
    paths_model, small_plan = paths_plan(args, plan)
    run_paths(paths_model, small_plan, args.cpu_rehearsal, book)
    nvml_lookup(book, args.cpu_rehearsal)
    oom_classify(book, args.cpu_rehearsal)
    save()
    if args.skip_pytest:
        results.data["pytest"] = {"status": "skipped", "pass": True, "reason": "--skip-pytest"}
        book.skip("gpu_tests", "--skip-pytest")
    else:
        results.data["pytest"] = run_pytest(args.cpu_rehearsal)
        pytest_result = results.data["pytest"]
        book.record("gpu_tests", pytest_result["pass"], summary=pytest_result.get("summary")
                    or pytest_result.get("reason") or pytest_result["status"])
    if args.oom:
        results.data["oom"] = oom_check(rehearsal=args.cpu_rehearsal)
        book.record("oom_fallback", results.data["oom"]["pass"])
        print("\n".join(describe_oom(results.data["oom"])))
    else:
        book.skip("oom_fallback", "run with --oom")
    if args.skip_serve:
        book.skip("e2e_server", "--skip-serve")
        book.skip("engine_trace", "--skip-serve")
    else:
        with tempfile.TemporaryDirectory(prefix="gpu-check-serve-") as tmp:
            model_dir = serve_model_dir(args, Path(tmp) / "model")
            site = unpack_wheels(CARRIED_WHEELS, Path(tmp) / "site") if carried_wheels_fit() else None
            serve_check(book, args.cpu_rehearsal, model_dir, site,
                        args.serve_seconds or (2.0 if args.cpu_rehearsal else 5.0))
        print(f"  e2e server: {json.dumps(book.checks['e2e_server'].to_json().get('runs', [{}])[-1])[:600]}")
        print(f"  engine trace: {json.dumps(book.checks['engine_trace'].to_json().get('runs', [{}])[-1])[:400]}")
    results.data["elapsed_s"] = time.perf_counter() - started
    results.data["pass"] = passed = book.passed
    save()
    print("checks:")
    print("\n".join(book.lines()))
    where = f"; JSON: {json_path}" if json_path else " (set $OUT or --json to keep the JSON)"
    print(f"gpu-check {'PASSED' if passed else 'FAILED'} in {results.data['elapsed_s']:.0f}s{where}")
    return 0 if passed else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    carry = sub.add_parser("prepare-carry", help="write an fp16 model copy and a pytest bundle to carry to a GPU")
    carry.add_argument("--model", help="model directory to copy in fp16 (default: the built-in model if built)")
    carry.add_argument("--dest", default=str(DEFAULT_DEST), help="output folder (default: %(default)s)")
    carry.add_argument("--serve-deps", action="store_true",
                       help="also the e2e server's dependencies, as wheels for the GPU host's Python, unpacked")
    carry.add_argument("--python", default="3.12", help="the GPU host's Python version, for --serve-deps")
    parser.add_argument("--model", help="model directory to check (default: the built-in model if it is built)")
    parser.add_argument("--json", help="where to write the JSON (default: $OUT/gpu-check.json when OUT is set)")
    parser.add_argument("--cpu-rehearsal", action="store_true",
                        help="run every step on the CPU with the eager stand-in capturer, on small sizes")
    parser.add_argument("--iterations", type=int, default=0, help="timed runs per shape and mode")
    parser.add_argument("--skip-pytest", action="store_true", help="do not run the gpu-marked tests")
    parser.add_argument("--skip-serve", action="store_true", help="do not run the end-to-end server check")
    parser.add_argument("--serve-seconds", type=float, default=0.0, help="seconds of load per rate (e2e_server)")
    parser.add_argument("--oom", action="store_true",
                        help="also fill GPU memory for a real OOM: CPU fallback, probe, recovery, memory pressure")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "prepare-carry":
        extra = {"serve_deps": args.serve_deps, "python": args.python}
        if args.model:
            return prepare(Path(args.model), Path(args.dest), **extra)  # an explicit model must load, or fail loudly
        built = default_model_dir()
        return prepare(built if (built / "model.safetensors").is_file() else None, Path(args.dest), **extra)
    return run_check(args)


if __name__ == "__main__":
    sys.exit(main())
