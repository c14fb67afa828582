"""A small Dockerfile reader for structural checks: instructions grouped into build stages, `ARG` defaults, and
`.dockerignore` matching. No Docker engine is needed (or available where the tests run)."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

_DIRECTIVE = re.compile(r"^#\s*\w+\s*=")
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    args: str  # the rest of the instruction, continuation lines joined
    line: int  # 1-based line of its first line

    def words(self) -> list[str]:
        """Exec form (a JSON array) as its items, shell form split like a shell would."""
        text = self.args.strip()
        if text.startswith("["):
            return [str(item) for item in json.loads(text)]
        return shlex.split(text)

    def flags_and_rest(self) -> tuple[dict[str, str], str]:
        """Leading `--name=value` flags (COPY --from=..., HEALTHCHECK --interval=...) and what follows them."""
        flags: dict[str, str] = {}
        rest = self.args.strip()
        while rest.startswith("--"):
            token, _, rest = rest.partition(" ")
            name, _, value = token[2:].partition("=")
            flags[name] = value
            rest = rest.lstrip()
        return flags, rest


@dataclass(slots=True)
class Stage:
    base: str  # the FROM image or stage reference, unexpanded
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass(slots=True)
class Dockerfile:
    global_args: dict[str, str | None]  # ARGs before the first FROM, with their defaults
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    @property
    def names(self) -> set[str]:
        return {s.name for s in self.stages if s.name}


def parse(path: Path) -> Dockerfile:
    logical: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or (stripped.startswith("#") and not _DIRECTIVE.match(stripped))):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped, as Docker does
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        logical.append((start, " ".join(part for part in pending if part)))
        pending = []
    assert not pending, f"{path}: the last instruction ends in a line continuation"

    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for line, text in logical:
        if _DIRECTIVE.match(text):
            continue
        keyword, _, args = text.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip(), line)
        if instruction.keyword == "FROM":
            words = instruction.args.split()
            words = [w for w in words if not w.startswith("--platform")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            assert instruction.keyword == "ARG", f"{path}:{line}: only ARG may come before the first FROM"
            global_args.update(arg_defaults(instruction))
        else:
            stages[-1].instructions.append(instruction)
    return Dockerfile(global_args, stages)


def arg_defaults(instruction: Instruction) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for word in instruction.words():
        name, eq, value = word.partition("=")
        out[name] = value if eq else None
    return out


def env_values(instruction: Instruction) -> dict[str, str]:
    """ENV in its `NAME=value ...` form (the one this project's Dockerfile uses)."""
    out: dict[str, str] = {}
    for word in instruction.words():
        name, eq, value = word.partition("=")
        assert eq, f"line {instruction.line}: use ENV NAME=value, not the legacy `ENV NAME value`"
        out[name] = value
    return out


def expand(text: str, values: dict[str, str]) -> str:
    return _VARIABLE.sub(lambda m: values[m.group(1) or m.group(2)], text)


def stage_chain(dockerfile: Dockerfile, build_args: dict[str, str]) -> list[Stage]:
    """The final stage and every stage it is built FROM, final first, for one set of build arguments."""
    values = {k: v for k, v in dockerfile.global_args.items() if v is not None} | build_args
    chain = [dockerfile.stages[-1]]
    while True:
        base = expand(chain[-1].base, values)
        if base not in dockerfile.names:
            return chain
        chain.append(dockerfile.stage(base))


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore `patterns` exclude `path`: a pattern matches the path or a folder above it, the last
    matching pattern decides, `!` re-includes. (fnmatch's `*` also crosses `/`, which Docker's does not; for the
    patterns this project uses the answers are the same.)"""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.removeprefix("!").strip("/")
        if any(fnmatch.fnmatchcase(candidate, glob) for candidate in candidates):
            excluded = not negate
    return excluded


def dockerignore_patterns(path: Path) -> list[str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]
