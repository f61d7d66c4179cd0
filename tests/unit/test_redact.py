"""URI passwords masked where config values leave the process; fingerprints of configs without
one unchanged, and a password change no reason to rerun a stage."""

from __future__ import annotations

import pytest

from corpora import CorpusError
from corpora.fetch import mirror_url
from filesystem.redact import redact_text, redact_uri, redacted, without_credentials
from tasks.framework.config import config_from_dict, to_dict
from tasks.framework.stage_fingerprint import stage_fingerprint, stage_identity


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("http://alice:s3cret@10.0.0.5:8000/m30k/", "http://alice:***@10.0.0.5:8000/m30k/"),
        ("postgresql://mlflow:p%40ss%2Fw@db:5432/mlflow", "postgresql://mlflow:***@db:5432/mlflow"),
        ("https://ghp_tokenonly@mirror.example/data", "https://***@mirror.example/data"),
        ("https://u:@host/x?y=1#z", "https://u:***@host/x?y=1#z"),
        ("http://u:p@[::1/x", "http://***@[::1/x"),  # unparseable: all of the user part masked
    ],
)
def test_a_uri_password_is_masked_and_the_rest_kept(uri: str, shown: str):
    assert redact_uri(uri) == shown


@pytest.mark.parametrize(
    "value",
    [
        "http://10.0.0.5:8000/m30k/",
        "file:///work/shared/data/multi30k",
        "sqlite:////tmp/run/mlflow.db",
        "someone@example.org",  # an address, not a URI
        "train.steps",
        "",
    ],
)
def test_strings_without_credentials_come_back_unchanged(value: str):
    assert redact_uri(value) == value
    assert without_credentials(value) == value


@pytest.mark.parametrize(
    ("uri", "server"),
    [
        ("http://alice:s3cret@10.0.0.5:5000", "http://10.0.0.5:5000"),
        ("https://tokenonly@mlflow.example/path", "https://mlflow.example/path"),
    ],
)
def test_a_server_is_named_without_its_credentials(uri: str, server: str):
    assert without_credentials(uri) == server


def test_uris_inside_free_text_are_masked_and_the_rest_kept():
    message = (
        "Max retries exceeded with url: http://pipe:s3cret@10.0.0.20:5000/api/2.0/x "
        "(also https://tok@h/y); mail ops@example.org"
    )
    assert redact_text(message) == (
        "Max retries exceeded with url: http://pipe:***@10.0.0.20:5000/api/2.0/x "
        "(also https://***@h/y); mail ops@example.org"
    )


def test_redacted_walks_nested_data_and_keeps_everything_else():
    data = {
        "data": {"mirror": "http://a:b@h/", "corpora": ("x", "y"), "n": 3},
        "list": ["https://t@h/", None, 1.5],
        "flag": True,
    }
    assert redacted(data) == {
        "data": {"mirror": "http://a:***@h/", "corpora": ("x", "y"), "n": 3},
        "list": ["https://***@h/", None, 1.5],
        "flag": True,
    }


def test_the_download_fingerprint_is_unchanged_without_a_password_and_ignores_one():
    from tasks import download

    def stage_config(mirror: str):
        return download.stage_config(
            config_from_dict({"name": "m", "data": {"source": "multi30k", "mirror": mirror}})
        )

    plain = stage_config("http://10.0.0.5:8000/m30k/")
    # What the fingerprint hashes is the data section as it always was.
    assert stage_identity("download", plain, {}, code={})["config"] == plain
    one = stage_config("http://alice:one@10.0.0.5:8000/m30k/")
    two = stage_config("http://alice:two@10.0.0.5:8000/m30k/")
    assert (
        stage_identity("download", one, {}, code={})["config"]["mirror"]
        == "http://alice:***@10.0.0.5:8000/m30k/"
    )
    fingerprints = {
        name: stage_fingerprint("download", cfg, {}, code={})
        for name, cfg in (("plain", plain), ("one", one), ("two", two))
    }
    assert fingerprints["one"] == fingerprints["two"] != fingerprints["plain"]


def test_a_bad_mirror_is_named_without_its_password():
    with pytest.raises(CorpusError, match=r"data.mirror 'ftp://u:\*\*\*@h/' must be") as err:
        mirror_url("https://www.statmt.org/wmt13/x.tgz", "ftp://u:hunter2@h/")
    assert "hunter2" not in str(err.value)


def test_the_summary_artifact_names_the_tracking_server_without_its_password():
    from pipelines.flows import summary_markdown

    config = config_from_dict(
        {"name": "s", "mlflow": {"tracking_uri": "https://ci:Pw-123@mlflow.example:5000"}}
    )
    text = summary_markdown(config, [], "abc123")
    assert "Pw-123" not in text and "(https://ci:***@mlflow.example:5000)" in text
    assert to_dict(config)["mlflow"]["tracking_uri"].endswith(
        "Pw-123@mlflow.example:5000"
    )  # the config keeps it
