"""Install packages into the project's venv with uv, from where pip is configured to look.

    python scripts/install.py VENV_PYTHON UV_REQUIREMENT [pip install arguments ...]

uv takes pip's index, extra indexes, find-links, constraints and certificate (`pip config
list`, which includes the PIP_* variables), so it installs what pip would, in seconds
where pip takes minutes. If uv cannot be installed or fails, pip installs instead.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

SETTING = re.compile(r"^([^.]*)\.([\w-]+)='(.*)'$")
# pip's setting -> uv's flag; values that pip takes as a space-separated list
LISTED = {"extra-index-url": "--extra-index-url", "find-links": "--find-links",
          "constraint": "--constraint"}
SINGLE = {"index-url": "--index-url"}


def pip_settings(python: str) -> dict[str, str]:
    """pip's configured settings by name: a PIP_* variable over the files, as in pip."""
    listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True,
                            text=True, check=False).stdout
    files: dict[str, str] = {}
    variables: dict[str, str] = {}
    for line in listed.splitlines():
        match = SETTING.match(line.strip())
        if match:
            section, name, value = match.groups()
            (variables if section == ":env:" else files)[name] = value
    return {**files, **variables}


def uv_arguments(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The uv flags and environment that ask for what ``settings`` ask pip for."""
    flags = []
    for name, flag in LISTED.items():
        for value in settings.get(name, "").split():
            flags += [flag, value]
    for name, flag in SINGLE.items():
        if settings.get(name):
            flags += [flag, settings[name]]
    if settings.get("no-index", "").lower() in ("1", "true", "yes"):
        flags.append("--no-index")
    env = {"SSL_CERT_FILE": settings["cert"]} if settings.get("cert") else {}
    # pip takes a release from whichever index has the best one; uv's default is the first
    # index that has the package at all
    return [*flags, "--index-strategy", "unsafe-best-match"], env


def main(python: str, uv_requirement: str, arguments: list[str]) -> int:
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    uv = Path(python).with_name("uv")
    if not uv.exists():
        subprocess.run([*pip, uv_requirement], check=False)
    if uv.exists():
        flags, env = uv_arguments(pip_settings(python))
        command = [str(uv), "pip", "install", "--quiet", "--python", python, *flags,
                   *arguments]
        if subprocess.run(command, env={**os.environ, **env}, check=False).returncode == 0:
            return 0
        print(f"uv could not install ({shlex.join(arguments)}); pip installs instead",
              file=sys.stderr)
    return subprocess.run([*pip, *arguments], check=False).returncode


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
