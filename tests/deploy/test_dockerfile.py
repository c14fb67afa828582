"""Dockerfile and .dockerignore, checked structurally (no Docker engine here): pinned bases that both variants
resolve to, a non-root user, a health check on /livez at the exposed port, no secrets, a minimal build context."""

from __future__ import annotations

import re
import tomllib

import pytest

from glassbox.service.settings import load_settings
from tests.deploy.dockerfile import (
    Dockerfile,
    Instruction,
    Stage,
    arg_defaults,
    dockerignore_patterns,
    env_values,
    expand,
    ignored,
    parse,
    stage_chain,
)
from tests.deploy.tools import COMPOSE_FILE, DOCKERFILE, ROOT, load_yaml

VARIANTS = ("cuda", "cu126", "cu128", "cu130", "cpu")
DEFAULT_CUDA_VARIANT = "cu128"  # what VARIANT=cuda builds
BAKE = ("0", "1")
SECRETISH = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse(DOCKERFILE)


def image_env(dockerfile: Dockerfile, variant: str, bake: str) -> dict[str, str]:
    """The ENV the final image carries, for one set of build arguments (base stages first)."""
    env: dict[str, str] = {}
    for stage in reversed(stage_chain(dockerfile, {"VARIANT": variant, "BAKE_MODEL": bake})):
        for instruction in stage.all("ENV"):
            env.update(env_values(instruction))
    return env


def final(dockerfile: Dockerfile) -> Stage:
    return dockerfile.stages[-1]


def test_build_arguments_default_to_the_cuda_variant_without_a_baked_model(dockerfile: Dockerfile) -> None:
    assert dockerfile.global_args == {"VARIANT": "cuda", "BAKE_MODEL": "0"}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("bake", BAKE)
def test_every_variant_resolves_to_its_own_pinned_base(dockerfile: Dockerfile, variant: str, bake: str) -> None:
    chain = stage_chain(dockerfile, {"VARIANT": variant, "BAKE_MODEL": bake})
    names = [stage.name for stage in chain]
    assert f"model-{bake}" in names and f"base-{variant}" in names, names
    external = chain[-1].base
    repository, _, tag = external.rpartition(":")
    assert repository and tag and tag != "latest" and "$" not in external, f"base image not pinned: {external}"
    expected = "ubuntu" if variant == "cpu" else "nvidia/cuda"
    assert repository == expected


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "cpu"])
def test_each_cuda_base_has_the_cuda_version_of_its_torch_build(dockerfile: Dockerfile, variant: str) -> None:
    """glassbox:cu126 is CUDA 12.6 in both its runtime base and its torch build: the driver it needs is one."""
    chain = stage_chain(dockerfile, {"VARIANT": variant, "BAKE_MODEL": "0"})
    tag = chain[-1].base.rpartition(":")[2]  # e.g. 12.8.1-runtime-ubuntu24.04
    major, minor = tag.split(".")[:2]
    index = image_env(dockerfile, variant, "0")["TORCH_INDEX_URL"].rstrip("/").rsplit("/", 1)[-1]
    assert index == f"cu{major}{minor}"
    if variant == "cuda":
        assert index == DEFAULT_CUDA_VARIANT


def test_every_from_is_a_stage_or_a_pinned_image(dockerfile: Dockerfile) -> None:
    arg_values = {"VARIANT": VARIANTS, "BAKE_MODEL": BAKE}
    for stage in dockerfile.stages:
        if "$" in stage.base:
            for name, values in arg_values.items():
                for value in values:
                    resolved = expand(stage.base, {**{k: v[0] for k, v in arg_values.items()}, name: value})
                    assert resolved in dockerfile.names, f"FROM {stage.base} with {name}={value}: no stage {resolved}"
        elif stage.base not in dockerfile.names:
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", stage.base) and not stage.base.endswith(":latest"), stage.base


@pytest.mark.parametrize("variant", VARIANTS)
def test_torch_comes_from_the_index_that_matches_the_variant(dockerfile: Dockerfile, variant: str) -> None:
    env = image_env(dockerfile, variant, "0")
    index = env["TORCH_INDEX_URL"]
    expected = {"cpu": "cpu", "cuda": DEFAULT_CUDA_VARIANT}.get(variant, variant)
    assert index.rstrip("/").rsplit("/", 1)[-1] == expected
    installs = [i.args for i in dockerfile.stage("builder").all("RUN") if "pip install" in i.args and "torch" in i.args]
    assert len(installs) == 1 and "--index-url" in installs[0] and "$TORCH_INDEX_URL" in installs[0], installs
    assert "TORCH_VERSION" in arg_defaults(dockerfile.stage("builder").all("ARG")[0])


def test_runs_as_the_unprivileged_user_it_creates(dockerfile: Dockerfile) -> None:
    stage = final(dockerfile)
    keywords = [i.keyword for i in stage.instructions]
    assert "USER" in keywords and "CMD" in keywords
    user_at = max(n for n, k in enumerate(keywords) if k == "USER")
    assert user_at < keywords.index("CMD") and user_at < keywords.index("ENTRYPOINT")
    user = stage.instructions[user_at].args.split(":")[0]
    assert user not in ("root", "0")
    created = " ".join(i.args for i in dockerfile.stage("app").all("RUN"))
    uid = re.search(r"useradd .*--uid (\d+)", created)
    assert uid is not None and uid.group(1) == user, (created, user)
    # The model volume is mounted (or the model built) at /models: the user must own it.
    assert "chown glassbox:glassbox /models" in created


def test_health_check_asks_livez_on_the_exposed_port(dockerfile: Dockerfile) -> None:
    stage = final(dockerfile)
    (check,) = stage.all("HEALTHCHECK")
    flags, rest = check.flags_and_rest()
    assert {"interval", "timeout", "start-period", "retries"} <= flags.keys()
    assert rest.startswith("CMD ")
    command = Instruction("CMD", rest.removeprefix("CMD "), check.line).words()
    assert command[:2] == ["python", "-c"], "no curl or wget in the image: the check runs Python"
    script = command[2]
    assert "urllib.request" in script and "/livez" in script
    (expose,) = stage.all("EXPOSE")
    port = expose.args.split("/")[0]
    assert f"os.environ.get('GLASSBOX_PORT', '{port}')" in script
    assert image_env(dockerfile, "cuda", "0")["GLASSBOX_PORT"] == port


def test_starts_glassbox_serve_on_all_interfaces(dockerfile: Dockerfile) -> None:
    stage = final(dockerfile)
    (entrypoint,) = stage.all("ENTRYPOINT")
    (cmd,) = stage.all("CMD")
    assert entrypoint.words()[-1:] + cmd.words() == ["glassbox", "serve", "--host", "0.0.0.0"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["glassbox"] == "glassbox.service.cli:main"


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_init_is_pid_1_and_hands_signals_to_glassbox(dockerfile: Dockerfile, variant: str) -> None:
    """The kernel drops a signal sent to a container's PID 1 unless the process handles it, and glassbox handles
    SIGTERM only once it serves: as PID 1 a stop during import and model load was lost (the server went on to serve
    until the kill at the end of the grace period). tini is PID 1 instead, installed in every variant's image."""
    (entrypoint,) = final(dockerfile).all("ENTRYPOINT")
    assert entrypoint.args.lstrip().startswith("["), "exec form: a shell form would make /bin/sh PID 1"
    assert entrypoint.words() == ["/usr/bin/tini", "--", "glassbox"]
    chain = stage_chain(dockerfile, {"VARIANT": variant, "BAKE_MODEL": "0"})
    installs = [i.args for stage in chain for i in stage.all("RUN") if "apt-get install" in i.args]
    assert any(re.search(r"\btini\b", args) for args in installs), installs


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("bake", BAKE)
def test_image_settings_are_valid_glassbox_settings(dockerfile: Dockerfile, variant: str, bake: str) -> None:
    env = image_env(dockerfile, variant, bake)
    settings = load_settings(environ={k: v for k, v in env.items() if k.startswith("GLASSBOX_")})
    assert settings.host == "0.0.0.0"
    assert settings.model == "/models/minilm-rt-sentiment"


def test_a_baked_model_is_built_where_the_server_looks(dockerfile: Dockerfile) -> None:
    (build,) = dockerfile.stage("model-1").all("RUN")
    assert 'glassbox model build --out "$GLASSBOX_MODEL"' in build.args
    assert not dockerfile.stage("model-0").instructions  # the default image carries no model


def test_no_secrets_in_build_arguments_or_environment(dockerfile: Dockerfile) -> None:
    names = list(dockerfile.global_args)
    for stage in dockerfile.stages:
        for instruction in stage.all("ARG"):
            names += list(arg_defaults(instruction))
        for instruction in stage.all("ENV"):
            names += list(env_values(instruction))
    assert names, "found no ARG or ENV at all: the parser is broken"
    assert not [name for name in names if SECRETISH.search(name)]
    for stage in dockerfile.stages:
        for instruction in stage.all("RUN"):
            assert "type=secret" not in instruction.args and "type=ssh" not in instruction.args


def test_build_context_holds_what_copy_needs_and_nothing_else(dockerfile: Dockerfile) -> None:
    patterns = dockerignore_patterns(ROOT / ".dockerignore")
    sources: list[str] = []
    for stage in dockerfile.stages:
        for instruction in stage.all("COPY"):
            flags, rest = instruction.flags_and_rest()
            if "from" in flags:
                continue
            sources += rest.split()[:-1]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert not ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"
    for private in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "deploy/k8s/deployment.yaml", ".env",
                    "service/__pycache__/app.cpython-311.pyc"):
        assert ignored(private, patterns), f"{private} would be sent to the Docker daemon"


def test_exposed_port_is_the_one_compose_publishes(dockerfile: Dockerfile) -> None:
    (expose,) = final(dockerfile).all("EXPOSE")
    port = int(expose.args.split("/")[0])
    services = load_yaml(COMPOSE_FILE)["services"]
    glassbox = [s for name, s in services.items() if name.startswith("glassbox-")]
    assert len(glassbox) == 2
    for service in glassbox:
        (mapping,) = service["ports"]
        assert int(str(mapping).rsplit(":", 1)[1]) == port
        assert int(service["environment"]["GLASSBOX_PORT"]) == port
