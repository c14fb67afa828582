"""Write docs/settings.md from the settings themselves (service/settings.py: the groups, each flag's one-line help,
its default, its GLASSBOX_* variable and the details the help leaves out), so the page never disagrees with
`glassbox serve --help`.

    python scripts/settings_doc.py           # rewrite docs/settings.md
    python scripts/settings_doc.py --check   # exit 1 when docs/settings.md is not what the settings say
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from glassbox.service.settings import ENV_PREFIX, Settings, choices_for  # noqa: E402
from glassbox.service.settings_help import DETAILS, GROUPS  # noqa: E402

DOC = ROOT / "docs" / "settings.md"


def shown_default(spec: dataclasses.Field[object]) -> str:
    value = spec.default
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "on" if value else "off"
    return "" if value == "" else str(value)


def render() -> str:
    specs = {spec.name: spec for spec in dataclasses.fields(Settings)}
    lines = [
        "# Settings",
        "",
        "Every setting of `glassbox serve`, in the groups of `glassbox serve --help`. Each is a flag and a",
        "`GLASSBOX_*` environment variable (a flag wins over the variable, the variable over the default); on/off",
        "settings take `--name` / `--no-name` and `1`/`0`, `true`/`false` in the variable. Secrets (the API key) have",
        "no flag: a flag value shows in `ps`; give them as a variable or a file. This page is written by",
        "`scripts/settings_doc.py` from `service/settings.py` and `service/settings_help.py`; a test fails when they",
        "differ.",
        "",
    ]
    for title, about, names in GROUPS:
        lines += [f"## {title[0].upper()}{title[1:]}", "", f"{about[0].upper()}{about[1:]}.", "",
                  "| flag | variable | default | what |", "| --- | --- | --- | --- |"]
        for name in names:
            spec = specs[name]
            secret = bool(spec.metadata.get("secret"))
            flag = "(none: a secret)" if secret else f"`--{name.replace('_', '-')}`"
            choices = choices_for(name)
            what = str(spec.metadata["help"])
            if choices:
                what += " (" + " | ".join(choices) + ")"
            if name in DETAILS:
                what += ". " + DETAILS[name]
            default = shown_default(spec)
            shown = f"`{default}`" if default else "—"
            cell = what.replace("|", "\\|")  # a pipe would end the table cell
            lines.append(f"| {flag} | `{ENV_PREFIX}{name.upper()}` | {shown} | {cell} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/settings.md differs")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not DOC.is_file() or DOC.read_text(encoding="utf-8") != text:
            print("docs/settings.md is not what service/settings.py says: run scripts/settings_doc.py",
                  file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
