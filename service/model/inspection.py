"""`glassbox model inspect DIR [--json]`: what a model directory is and whether glassbox can serve it, and why not.

Every check `glassbox serve` makes at start-up runs here, but each one's failure is collected instead of stopping
the rest: config.json (family, head, labels), the weights (safetensors, sharded or not, names and shapes read from
the file headers without loading the tensors), tokenizer.json (ids within the vocabulary, text pairs). Weights are
never unpickled: a pickled checkpoint is reported with the command that converts it.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from glassbox.service.errors import ModelLoadError
from glassbox.service.model.checkpoint import WEIGHTS_INDEX, locate, tensor_shapes
from glassbox.service.model.config import ModelConfig, read_config
from glassbox.service.model.files import CONFIG_FILE, TOKENIZER_FILE, check_tokenizer, directory_problem
from glassbox.service.model.reference import REFERENCE_FILE, read_reference
from glassbox.service.model.reference import describe as describe_reference
from glassbox.service.model.weights import check_hf_tensors
from glassbox.service.tokenizer import TextTokenizer


@dataclass
class Report:
    path: str
    servable: bool = False
    problems: list[str] = field(default_factory=list)
    family: str | None = None
    model_type: str | None = None
    architecture: str | None = None
    problem_type: str | None = None
    labels: list[str] = field(default_factory=list)
    max_length: int | None = None  # tokens, special tokens included
    parameters: int | None = None
    weights: str | None = None
    pairs: bool | None = None  # the tokenizer can join two texts
    labels_named: bool = True  # False: no id2label in config.json, transformers' default names served
    reference: str | None = None  # its reference.json for drift, described; None when it cannot tell yet


def _weights(directory: Path, config: ModelConfig | None, report: Report) -> None:
    located = locate(directory)  # ModelLoadError for a pickle or missing files, with the fix
    report.weights = (f"{len(located.files)} shard(s) listed in {WEIGHTS_INDEX}" if located.index is not None
                      else located.files[0].name)
    shapes = tensor_shapes(directory)
    report.parameters = sum(math.prod(shape) for shape in shapes.values())
    if config is not None:
        # Shapes only: tensors on the meta device hold no data, so a multi-GB checkpoint is checked in milliseconds.
        meta = {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}
        check_hf_tensors(meta, config, require_head=True, source=str(directory))


def _tokenizer(directory: Path, config: ModelConfig | None, report: Report) -> None:
    path = directory / TOKENIZER_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing: a model directory needs {TOKENIZER_FILE}")
    if config is not None:
        check_tokenizer(path, config)
        report.pairs = TextTokenizer.from_file(path, config.max_tokens, config.max_tokens).pairs


def inspect_directory(directory: Path) -> Report:
    report = Report(path=str(directory))
    problem = directory_problem(directory)
    if problem is not None:
        report.problems.append(problem)
        return report
    config: ModelConfig | None = None
    try:
        config = read_config(directory / CONFIG_FILE)
        report.family, report.model_type, report.architecture = config.family, config.model_type, config.architecture
        report.problem_type, report.labels, report.max_length = (config.problem_type, list(config.id2label),
                                                                 config.max_tokens)
        report.labels_named = config.labels_named
        if not config.id2label:
            report.problems.append(f"{directory / CONFIG_FILE} has no id2label: glassbox serves classifiers and "
                                   "needs the label names")
    except ModelLoadError as exc:
        report.problems.append(exc.message)
    for check in (_weights, _tokenizer):
        try:
            check(directory, config, report)
        except ModelLoadError as exc:
            report.problems.append(exc.message)
    report.servable = config is not None and not report.problems
    try:
        reference = read_reference(directory)
        if reference is not None and config is not None and (
                reference.labels != config.id2label or reference.problem != config.problem_type):
            report.reference = (f"{REFERENCE_FILE} does not match this model (counted for other labels or another "
                                "head): the server takes its reference from the first texts served")
        else:
            report.reference = describe_reference(reference)
    except ModelLoadError as exc:  # not a reason to refuse the model: the server measures drift against traffic
        report.reference = f"unreadable: {exc.message}"
    return report


def human(report: Report) -> str:
    verdict = "yes" if report.servable else "no"
    lines = [f"path          {report.path}", f"servable      {verdict}"]
    lines += [f"  problem     {problem}" for problem in report.problems]
    if report.family is not None:
        lines += [
            f"family        {report.family} (model_type {report.model_type}, {report.architecture})",
            f"head          {report.problem_type}, {len(report.labels)} output(s): {', '.join(report.labels[:8])}"
            + (" ..." if len(report.labels) > 8 else "")
            + ("" if report.labels_named else " (config.json has no id2label: transformers' default names)"),
            f"max length    {report.max_length} tokens",
        ]
    if report.weights is not None:
        lines.append(f"weights       {report.weights}, {report.parameters or 0:,} parameters")
    if report.pairs is not None:
        lines.append(f"text pairs    {'yes' if report.pairs else 'no (tokenizer.json has no pair template)'}")
    if report.reference is not None:
        lines.append(f"reference     {report.reference}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="model directory (config.json, weights, tokenizer.json)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    """Exit 0 when the directory is servable, 1 when it is not (the report says why)."""
    report = inspect_directory(args.directory.expanduser())
    print(json.dumps(asdict(report), indent=2) if args.json else human(report))
    return 0 if report.servable else 1
