"""Package boundaries and the console command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_analysis_never_imports_locust_or_gevent() -> None:
    code = (
        "import importlib, pkgutil, sys, analysis\n"
        "for m in pkgutil.walk_packages(analysis.__path__, 'analysis.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('locust', 'gevent'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


def test_llmload_version_and_help() -> None:
    exe = Path(sys.executable).with_name("llmload")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("llmload ")
    helptext = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True)
    assert "COMMAND" in helptext.stdout


def test_unknown_subcommand_is_one_line_and_exit_2() -> None:
    exe = Path(sys.executable).with_name("llmload")
    out = subprocess.run([exe, "no-such-command"], capture_output=True, text=True)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "invalid choice" in out.stderr


def test_every_command_is_documented_in_the_readme() -> None:
    from infra.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in sub.choices if f"`llmload {name}" not in readme]
    assert missing == []
