"""`make venv`'s installs through uv (.ci/uv_pip.py): pip's configured sources reach uv by pip's
precedence (a PIP_* variable over a file's install section over its global one), each of a list's
values as one option, and a command's own index replaces pip's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("uv_pip", ROOT / ".ci" / "uv_pip.py")
assert _spec is not None and _spec.loader is not None
uv_pip = importlib.util.module_from_spec(_spec)
sys.modules["uv_pip"] = uv_pip
_spec.loader.exec_module(uv_pip)

LISTING = """\
global.index-url='https://mirror.example/simple'
global.extra-index-url='file:///srv/a/simple file:///srv/b/simple'
global.find-links='/srv/old-wheels'
install.find-links='/srv/wheels'
global.constraint='/srv/constraints.txt'
global.cert='/srv/ca.pem'
user.unknown='ignored'
:env:.default-timeout='180'
"""


def test_pip_settings_follow_pips_precedence():
    settings = uv_pip.pip_settings(LISTING + ":env:.find-links='/srv/env-wheels'\n")
    assert settings["find-links"] == "/srv/env-wheels"  # a variable over both files' sections
    assert uv_pip.pip_settings(LISTING)["find-links"] == "/srv/wheels"  # install over global
    assert "unknown" not in settings


def test_every_source_reaches_uv_and_a_commands_index_replaces_pips():
    options, env = uv_pip.uv_options(uv_pip.pip_settings(LISTING))
    pairs = list(zip(options, options[1:], strict=False))  # each option and what follows it
    assert ("--index-strategy", "unsafe-best-match") in pairs  # pip's best version of any index
    assert "--compile-bytecode" in options  # and its modules compiled at install
    assert ("--index-url", "https://mirror.example/simple") in pairs
    assert [v for f, v in pairs if f == "--extra-index-url"] == [
        "file:///srv/a/simple",
        "file:///srv/b/simple",
    ]
    assert ("--find-links", "/srv/wheels") in pairs
    assert ("--constraint", "/srv/constraints.txt") in pairs
    assert env == {"SSL_CERT_FILE": "/srv/ca.pem", "UV_HTTP_TIMEOUT": "180"}
    options, _ = uv_pip.uv_options(uv_pip.pip_settings(LISTING), given_index=True)
    assert "--index-url" not in options and "--extra-index-url" in options


def test_no_configuration_is_pips_defaults():
    assert uv_pip.uv_options(uv_pip.pip_settings("")) == (
        ["--index-strategy", "unsafe-best-match", "--compile-bytecode"],
        {},
    )
