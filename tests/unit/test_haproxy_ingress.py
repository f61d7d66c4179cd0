"""``serve.ingress``: which ingress a config comes to, and the HAProxy config Ray Serve renders
put on loopback before HAProxy reads it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from serving import haproxy_ingress
from transformer_core.config_checks import ConfigError


def ray_serves_binds() -> list[str]:
    """The bind lines of Ray Serve's HAProxy config template, its placeholders filled as a
    local ``tfm serve`` fills them (host 127.0.0.1, some port)."""
    from ray.serve._private.haproxy_templates import HAPROXY_CONFIG_TEMPLATE

    lines = [
        line for line in HAPROXY_CONFIG_TEMPLATE.splitlines() if line.strip().startswith("bind ")
    ]
    lines = [re.sub(r"\{\{\s*config\.\w*host\s*\}\}", "127.0.0.1", line) for line in lines]
    return [re.sub(r"\{\{\s*config\.\w*port\s*\}\}", "8404", line) for line in lines]


def test_every_bind_of_ray_serves_haproxy_config_ends_on_loopback():
    binds = ray_serves_binds()
    assert len(binds) >= 3, binds  # the frontend, the stats page and the Prometheus frontend
    assert any("127.0.0.1" not in line for line in binds), "nothing to rewrite any more"
    rewritten = haproxy_ingress.rewrite("\n".join(binds)).splitlines()
    assert all(line.split()[1] == "127.0.0.1:8404" for line in rewritten), rewritten


def test_the_admin_socket_is_its_owners_only():
    line = (
        "    stats socket /tmp/haproxy-serve/n/admin.sock mode 666 level admin expose-fd listeners"
    )
    assert "mode 600 level admin" in haproxy_ingress.rewrite(line)


def test_the_wrapper_rewrites_the_config_in_place_then_becomes_haproxy(tmp_path: Path):
    config = tmp_path / "haproxy.cfg"
    config.write_text("frontend stats\n  bind *:8404\n")
    env = {**os.environ, haproxy_ingress.REAL: "/bin/echo"}  # echo its arguments instead
    found = subprocess.run(
        [sys.executable, "-m", "serving.haproxy_ingress", "-db", "-f", str(config), "-dR"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert found.stdout.split() == ["-db", "-f", str(config), "-dR"]  # the same path: Ray checks it
    assert config.read_text() == "frontend stats\n  bind 127.0.0.1:8404\n"


def test_auto_is_the_python_proxy_on_a_cluster_and_proxy_is_always_itself():
    assert haproxy_ingress.choose("auto", local=False) == "proxy"
    assert haproxy_ingress.choose("proxy", local=True) == "proxy"


def test_haproxy_on_a_cluster_or_without_its_binary_is_one_config_error(monkeypatch):
    with pytest.raises(
        ConfigError, match="serve.ingress: haproxy is set up by tfm serve for a local"
    ):
        haproxy_ingress.choose("haproxy", local=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="no haproxy on PATH"):
        haproxy_ingress.choose("haproxy", local=True)
    assert haproxy_ingress.choose("auto", local=True) == "proxy"
