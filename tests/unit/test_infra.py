"""Every infra file parses, and the entrypoints, configs and paths it names exist."""

from __future__ import annotations

import ast
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA_YAML = sorted(p for p in (ROOT / "infra").rglob("*.yaml"))
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def _docs(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _entrypoint_exists(entry: str) -> bool:
    file, func = entry.split(":")
    tree = ast.parse((ROOT / file).read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body)


def _check_tfm_command(command: str) -> None:
    words = shlex.split(command)
    assert words[0] in SCRIPTS, command
    from pipelines.cli import build_parser

    args = build_parser().parse_args(words[1:])
    for attr in ("config",):
        value = getattr(args, attr, None)
        if value:
            assert (ROOT / value).is_file(), f"{command}: {value} does not exist"


def test_there_is_infra_for_every_runtime():
    names = {p.relative_to(ROOT / "infra").as_posix() for p in (ROOT / "infra").rglob("*") if p.is_file()}
    assert {"ray/cluster.yaml", "k8s/raycluster.yaml", "k8s/rayjob.yaml", "docker/Dockerfile",
            "mlflow/docker-compose.yaml"} <= names


@pytest.mark.parametrize("path", INFRA_YAML, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_yaml_parses(path: Path):
    assert _docs(path)


def test_deployments_name_real_flows():
    """``tfm deploy`` is the one place deployments are defined; its entrypoints must exist."""
    text = (ROOT / "pipelines" / "deploy.py").read_text()
    entrypoints = re.findall(r'"(pipelines/flows\.py:\w+)"', text)
    assert len(entrypoints) == 2
    for entry in entrypoints:
        assert _entrypoint_exists(entry), entry


def test_kuberay_job_runs_tfm_on_a_shipped_config():
    job = _docs(ROOT / "infra/k8s/rayjob.yaml")[0]
    assert job["kind"] == "RayJob"
    _check_tfm_command(job["spec"]["entrypoint"])
    cluster = _docs(ROOT / "infra/k8s/raycluster.yaml")[0]
    assert cluster["kind"] == "RayCluster"
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"


def test_ray_launcher_has_gpu_workers_and_loopback_dashboard():
    cluster = _docs(ROOT / "infra/ray/cluster.yaml")[0]
    workers = cluster["available_node_types"]["gpu_worker"]
    assert workers["resources"]["GPU"] >= 1
    assert any("--dashboard-host=127.0.0.1" in c for c in cluster["head_start_ray_commands"])


def test_mlflow_server_binds_to_loopback_and_keeps_secrets_out():
    compose = _docs(ROOT / "infra/mlflow/docker-compose.yaml")[0]
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:") or port.startswith("${MLFLOW_BIND:-127.0.0.1}"), (name, port)
    text = (ROOT / "infra/mlflow/docker-compose.yaml").read_text()
    assert "postgresql://" in text and "s3://" in text
    assert not re.search(r"PASSWORD:\s*[^$\s]", text), "passwords must come from the env file"


def test_dockerfile_copies_every_package_and_runs_tfm():
    text = (ROOT / "infra/docker/Dockerfile").read_text()
    copied = set()
    for line in text.splitlines():
        if line.startswith("COPY"):
            sources = [w for w in line.split()[1:-1] if not w.startswith("--")]
            for src in sources:
                assert (ROOT / src).exists(), src
            copied.update(sources)
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in packages} <= copied
    assert re.search(r'CMD \["tfm"', text)
