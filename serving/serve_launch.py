"""Starting and stopping ``tfm serve``'s application on the Ray the command is connected to:
Ray Serve's HTTP proxy on ``serve.host:serve.port`` (127.0.0.1 unless configured), and the
``ModelServer`` deployment with its replicas or autoscaling."""

from __future__ import annotations

import hashlib
import logging
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from serving import ServingError
from serving.serve_config import ServeConfig
from transformer_core.config_checks import ConfigError

__all__ = ["APP", "check_port", "deploy", "token_sha256", "undeploy"]

APP = "tfm"
"""The Ray Serve application's name."""
DEPLOYMENT = "translator"


def token_sha256(settings: ServeConfig, environ: Mapping[str, str]) -> str | None:
    """The sha256 of the bearer token ``serve.token_env`` or ``serve.token_file`` holds, or
    None when neither is set; an unset variable, or an empty or unreadable file, is a
    ConfigError naming the key."""
    if settings.token_env is not None:
        token = environ.get(settings.token_env, "").strip()
        if not token:
            raise ConfigError("serve.token_env", f"${settings.token_env} is not set or empty")
    elif settings.token_file is not None:
        try:
            token = Path(settings.token_file).expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError("serve.token_file", f"cannot read it: {exc.strerror}") from None
        if not token:
            raise ConfigError("serve.token_file", f"{settings.token_file} is empty")
    else:
        return None
    return hashlib.sha256(token.encode()).hexdigest()


def check_port(host: str, port: int) -> None:
    """A ConfigError naming ``serve.port`` when ``host:port`` cannot be bound here (Ray Serve's
    proxy on this machine would retry it in the background and the command would wait for
    nothing)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError("serve.port", f"{host}:{port}: {exc.strerror}") from None


def deploy(
    model_uri: str,
    tracking_uri: str | None,
    settings: ServeConfig,
    token: str | None,
    loopback: bool = True,
) -> str:
    """Start Ray Serve (its proxy on ``settings.host:port``) and the model's application,
    waiting until every replica has loaded the version; returns the invocations URL.
    ``loopback``: Ray is a local one, every port of its replicas on 127.0.0.1. Ray
    Serve's access log (method, route, status, latency; never a body) and the replicas' lines
    go to its log files in Ray's session folder."""
    # Its driver-side INFO lines say what the command's own line says (and that options it
    # was given "will not be applied" by serve.run, which it was not given).
    serve_logger = logging.getLogger("ray.serve")
    serve_logger.addFilter(_warnings_only)  # a filter: Ray Serve sets the logger's level itself
    try:
        _run(model_uri, tracking_uri, settings, token, loopback)
    finally:
        serve_logger.removeFilter(_warnings_only)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"http://{host}:{settings.port}/invocations"


def _warnings_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def _run(
    model_uri: str,
    tracking_uri: str | None,
    settings: ServeConfig,
    token: str | None,
    loopback: bool,
) -> None:
    from ray import serve
    from ray.serve.deployment import Deployment

    from serving.model_server import ModelServer

    serve.start(http_options={"host": settings.host, "port": settings.port})
    options: dict = {
        "max_ongoing_requests": settings.max_ongoing_requests,
        "max_queued_requests": settings.max_queued_requests,
        "ray_actor_options": {"num_cpus": settings.cpus_per_replica},
        # A version that cannot load fails the command in one go, not after 20 tries.
        "max_constructor_retry_count": 1,
    }
    scaling = settings.autoscaling
    if scaling is None:
        options["num_replicas"] = settings.replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": scaling.min_replicas,
            "max_replicas": scaling.max_replicas,
            "target_ongoing_requests": scaling.target_ongoing_requests,
        }
    # cast: serve.deployment's stub types a decorated class as a function.
    deployment = cast(Deployment, serve.deployment(ModelServer, name=DEPLOYMENT)).options(**options)
    try:
        serve.run(
            deployment.bind(model_uri, tracking_uri, settings, token, loopback),
            name=APP,
            route_prefix="/",
        )
    except RuntimeError as exc:  # the replicas' constructor failed: its last line says why
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise ServingError(
            f"{model_uri} could not be served: {lines[-1] if lines else exc}"
        ) from None


def undeploy() -> None:
    """Delete the application and stop Ray Serve."""
    from ray import serve

    serve.shutdown()
