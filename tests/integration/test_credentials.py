"""A mirror behind HTTP basic auth, its ``user:password@`` in ``data.mirror``: the download stage,
run as a Prefect flow (MLflow parent and child runs, the summary artifact), fetches the real
Multi30k files with those credentials, and the password is in no console line, log record,
file of the work dir (manifests, lock file, cache, MLflow's database and artifacts), MLflow
param or tag, or Prefect artifact or log."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers.mirror import MirrorServer
from helpers.shared_data import SHARED_DATA

pytestmark = [pytest.mark.integration, pytest.mark.shared_data("multi30k/data/task1/raw")]

USER = "mirror-user"
SECRET = "Pa55-xq7-Secret"
"""A string found nowhere else, so that any hit is a leak."""


@pytest.fixture
def auth_mirror():
    """The shared Multi30k files over HTTP, for ``USER`` with ``SECRET`` only."""
    srv = MirrorServer(SHARED_DATA / "multi30k")
    srv.auth = (USER, SECRET)
    yield srv
    srv.close()


def files_holding(root: Path, secret: bytes) -> list[str]:
    return [str(p) for p in sorted(root.rglob("*")) if p.is_file() and secret in p.read_bytes()]


def prefect_records(path: str, body: dict) -> list[dict]:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        response = client._client.post(path, json=body)
    response.raise_for_status()
    return response.json()


def test_the_fetcher_sends_the_credentials_and_names_urls_without_them(tmp_path: Path, auth_mirror):
    from corpora.fetch import DownloadError, download

    url = f"{auth_mirror.url}/data/task1/raw/val.de.gz"
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(url, timeout=10)  # the mirror refuses strangers
    with pytest.raises(DownloadError, match="HTTP 401") as anonymous:
        download(url, tmp_path / "anonymous.gz", max_retries=1)
    wrong = url.replace("http://", f"http://{USER}:wrong-{SECRET}@")
    with pytest.raises(DownloadError, match="HTTP 401") as refused:
        download(wrong, tmp_path / "wrong.gz", max_retries=1)
    missing = url.replace("http://", f"http://{USER}:{SECRET}@").replace("val.de", "val.xx")
    with pytest.raises(DownloadError, match="HTTP 404") as not_found:
        download(missing, tmp_path / "missing.gz", max_retries=1)
    for err in (anonymous, refused, not_found):
        assert SECRET not in str(err.value) and str(err.value).startswith(auth_mirror.url)

    seen = download(url.replace("http://", f"http://{USER}:{SECRET}@"), tmp_path / "val.de.gz")
    assert (tmp_path / "val.de.gz").read_bytes() == (
        SHARED_DATA / "multi30k" / "data/task1/raw/val.de.gz"
    ).read_bytes()
    assert seen.bytes == (tmp_path / "val.de.gz").stat().st_size
    assert len(auth_mirror.refused) == 3


@pytest.mark.slow  # a Prefect flow on the shared Multi30k files: ~20 s
def test_a_download_flow_uses_the_mirror_password_and_shows_it_nowhere(
    tmp_path: Path, harness, auth_mirror, capfd, caplog
):
    from mlflow import MlflowClient
    from prefect.logging.handlers import APILogHandler

    from pipelines.flows import artifact_key, stage_flow
    from tasks.framework.config import load_config
    from tasks.framework.manifest import read_manifest

    caplog.set_level(logging.INFO)  # the stages' INFO lines on the console, as under `tfm`
    mirror = auth_mirror.url.replace("http://", f"http://{USER}:{SECRET}@") + "/"
    masked = auth_mirror.url.replace("http://", f"http://{USER}:***@") + "/"
    config_file = tmp_path / "secrets.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "name": "secrets",
                "workdir": str(tmp_path / "runs" / "{name}"),
                "data": {"source": "multi30k", "pair": "en-de", "mirror": mirror},
            }
        )
    )

    [result] = stage_flow(config_path=str(config_file), stage="download")

    # The credentials were used: the real files came, each verified against its published sha256.
    assert result.ran and (result.stats["train_lines"], result.stats["dev_lines"]) == (29000, 1014)
    assert auth_mirror.refused == [] and len(auth_mirror.requests) == 6
    config = load_config(str(config_file))
    manifest = read_manifest(result.path)
    assert manifest["config"]["mirror"] == masked and manifest["stats"]["mirror"] == masked

    # Nowhere in the work dir (manifest, lock file, cache, MLflow's SQLite store and artifacts).
    assert files_holding(config.root, SECRET.encode()) == []
    # Nor on the console (the stages' log lines), where the download names the mirror masked.
    console = capfd.readouterr()
    assert SECRET not in console.out and SECRET not in console.err
    assert f"download: {masked}data/task1/raw/val.de.gz" in console.err

    client = MlflowClient(config.tracking_uri)
    experiment = client.get_experiment_by_name(config.mlflow.experiment)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2  # the flow's parent run and the download stage's run
    for run in runs:
        assert SECRET not in repr(run.data.params) and SECRET not in repr(run.data.tags)
    parent = next(r for r in runs if "pipeline" in r.data.tags)
    assert parent.data.params["data.mirror"] == masked
    stage = next(r for r in runs if r.data.tags.get("stage") == "download")
    assert stage.data.tags["stats.mirror"] == masked

    flow_run_id = parent.data.tags["prefect.flow_run_id"]
    [artifact] = prefect_records(
        "/artifacts/filter",
        {
            "artifacts": {"key": {"any_": [artifact_key("secrets")]}},
            "sort": "UPDATED_DESC",
            "limit": 1,
            "offset": 0,
        },
    )
    assert "| download | ran |" in artifact["data"] and SECRET not in artifact["data"]
    APILogHandler().flush()  # the flow's logs reach the API in the background
    logs = prefect_records(
        "/logs/filter",
        {
            "logs": {"flow_run_id": {"any_": [flow_run_id]}},
            "limit": 200,
            "offset": 0,
        },
    )
    assert logs and all(SECRET not in entry["message"] for entry in logs)
    # Nor in the flow and task runs Prefect keeps (parameters, inputs, state messages).
    for kind in ("flow_runs", "task_runs"):
        runs_kept = prefect_records(
            f"/{kind}/filter",
            {
                "flow_runs": {"id": {"any_": [flow_run_id]}},
                "limit": 50,
                "offset": 0,
            },
        )
        assert runs_kept and SECRET not in json.dumps(runs_kept), kind
