"""`glassbox --version` prints the installed version, the one glassbox_build_info and the /v2 metadata report."""

from __future__ import annotations

from importlib import metadata

import pytest

from glassbox.service.cli import main
from glassbox.service.version import version
from glassbox.service.wire.kserve import server_metadata
from glassbox.telemetry.collectors import build_info_labels


def test_version_flag_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"glassbox {metadata.version('glassbox-serve')}\n"


def test_every_report_of_the_version_agrees() -> None:
    assert version() == metadata.version("glassbox-serve") != "unknown"
    assert build_info_labels("m", "cpu")["version"] == version()
    assert server_metadata()["version"] == version()


def test_an_uninstalled_tree_says_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert version() == "unknown"
