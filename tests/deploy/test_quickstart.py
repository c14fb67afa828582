"""docs/quickstart.md names only things that exist: every GLASSBOX_* variable is a setting (or the chaos token,
which is deliberately not one), every `glassbox chaos run NAME` a built-in experiment, every dashboard title one
in grafana/dashboards."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from glassbox.chaos.cli.run import builtin_experiments
from glassbox.service.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = (ROOT / "docs" / "quickstart.md").read_text()
# Read from the environment only (a flag would show a token in `ps`), or the Makefile's flags for `make run`.
NOT_SETTINGS = {"GLASSBOX_CHAOS_TOKEN", "GLASSBOX_ARGS"}


def test_every_variable_named_is_a_setting() -> None:
    settings = {ENV_PREFIX + field.name.upper() for field in dataclasses.fields(Settings)}
    named = set(re.findall(r"\bGLASSBOX_[A-Z0-9_]+", QUICKSTART))
    assert named, "the quick start names no settings at all"
    assert named - NOT_SETTINGS <= settings, sorted(named - NOT_SETTINGS - settings)


def test_every_experiment_named_is_built_in() -> None:
    named = set(re.findall(r"glassbox chaos run ([a-z][a-z-]+)", QUICKSTART))
    assert named and named <= set(builtin_experiments()), named


def test_every_dashboard_named_exists() -> None:
    titles = {json.loads(path.read_text())["title"] for path in (ROOT / "grafana" / "dashboards").glob("*.json")}
    named = set(re.findall(r"\*\*(glassbox / [^*]+)\*\*", QUICKSTART))
    assert named and named <= titles, sorted(named - titles)
