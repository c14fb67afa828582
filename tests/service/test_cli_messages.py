"""The command line's mistakes are reported by the command that was meant, with its own usage."""

from __future__ import annotations

import pytest

from service.cli import main


@pytest.mark.parametrize(("argv", "usage"), [
    (["serve", "--max-batchsize", "8"], "usage: glassbox serve "),
    (["bench", "engine", "--repeats", "2"], "usage: glassbox bench engine "),
    (["model", "inspect", "dir", "--jsn"], "usage: glassbox model inspect "),
])
def test_a_mistyped_flag_prints_the_subcommands_usage(argv: list[str], usage: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert f"error: unrecognized arguments: {' '.join(argv[-2:] if argv[-1].isdigit() else argv[-1:])}" in err
