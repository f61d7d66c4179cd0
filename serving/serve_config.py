"""``tfm serve``'s settings: the config's ``serve`` section (``ServeConfig``): where the server
listens, who may call it, how many replicas decode on which engine, how requests from many
clients are batched together, and what one request may ask (``RequestLimits``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from serving.ct2_options import ComputeType
from serving.scoring_protocol import RequestLimits
from transformer_core.config_checks import ConfigError, check_choices

__all__ = ["Autoscaling", "BatchUnit", "Ingress", "ServeConfig", "ServeEngine"]

BatchUnit = Literal["sentences", "tokens"]
"""What ``ServeConfig.max_batch`` counts: texts, or their source pieces (EOS included)."""
ServeEngine = Literal["auto", "torch", "ctranslate2"]
"""Who decodes a served version (``ServeConfig.engine``)."""
Ingress = Literal["auto", "haproxy", "proxy"]
"""What receives the HTTP requests (``ServeConfig.ingress``)."""


@dataclass(frozen=True, kw_only=True)
class Autoscaling:
    """Ray Serve's autoscaling of the replicas, by the requests each one holds."""

    min_replicas: int = 1
    """Replicas kept however quiet the traffic."""
    max_replicas: int = 2
    """Replicas at most."""
    target_ongoing_requests: float = 32.0
    """Requests in a replica (decoding or waiting for its batch) that Ray Serve aims at: more
    on average adds replicas, fewer removes them."""

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ConfigError(
                "max_replicas",
                f"{self.max_replicas} must be >= 1 and >= min_replicas ({self.min_replicas})",
            )
        if self.target_ongoing_requests <= 0:
            raise ConfigError("target_ongoing_requests", "must be > 0")


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """``tfm serve``: a registered version on Ray Serve (docs/serving.md)."""

    host: str = "127.0.0.1"
    """Address the HTTP server binds; 0.0.0.0 opens it to the network (put a gateway and
    token_env or token_file in front)."""
    port: int = 8000
    """HTTP port of Ray Serve's proxy."""
    ingress: Ingress = "auto"
    """What receives the requests: haproxy (HAProxy in front of replicas that answer HTTP
    themselves; about twice the requests a second on 2 cores), proxy (Ray Serve's Python
    proxy), or auto (haproxy on a local Ray where the haproxy binary is installed, else
    proxy; on a cluster, what its nodes' Ray was started with)."""
    replicas: int = 1
    """Replicas of the model, each a Ray actor that loads the version once (without
    autoscaling)."""
    autoscaling: Autoscaling | None = None
    """Ray Serve's autoscaling instead of a fixed number of replicas; null: replicas."""
    cpus_per_replica: float = 1.0
    """Ray CPUs each replica reserves (what places replicas on a cluster's nodes)."""
    threads: int = 0
    """Intra-op threads of each replica's engine (torch or CTranslate2); 0: as many as its
    CPUs (cpus_per_replica, at least 1). Keep replicas x threads within the machine's cores."""
    engine: ServeEngine = "auto"
    """Who decodes: auto (the version's CTranslate2 export where it has one, else torch), torch,
    or ctranslate2 (a version without an export is exported as a replica loads it)."""
    compute_type: ComputeType = "int8"
    """CTranslate2's compute type for engine ctranslate2 (or auto with an export): int8 is the
    fastest on CPUs; it changes some outputs (docs/translation.md)."""
    max_batch: int = 64
    """The most a replica decodes together, in batch_unit: requests from many clients are
    gathered up to it (a request over it is decoded alone)."""
    batch_unit: BatchUnit = "sentences"
    """What max_batch counts: sentences, or tokens (the texts' source pieces with EOS)."""
    batch_wait_s: float = 0.02
    """Seconds a replica waits for more requests once the first of a batch has come."""
    max_ongoing_requests: int = 256
    """Requests one replica holds at a time (decoding and waiting for a batch); more wait in
    Ray Serve's queue."""
    max_queued_requests: int = 1024
    """Requests waiting for a replica beyond that; more are answered 503 at once (-1: no
    bound)."""
    poll_seconds: float = 30.0
    """With an alias (models:/NAME@ALIAS): seconds between two looks at where it points; a
    new version is loaded beside the old and takes over with no failed request. 0: never
    looks again."""
    token_env: str | None = None
    """Name of an environment variable holding the bearer token clients must send
    (Authorization: Bearer ...); read once, at the command's start."""
    token_file: str | None = None
    """Or a file holding the token (one line); null for both: no token asked."""
    limits: RequestLimits = field(default_factory=RequestLimits)
    """What one request may ask; checked before decoding, each refusal a 4xx naming its
    limit. A registered version carries the limits of the config that registered it, for
    mlflow models serve."""

    @property
    def engine_threads(self) -> int:
        """The threads each replica's engine runs (``threads``, or its CPUs)."""
        return self.threads or max(1, math.ceil(self.cpus_per_replica))

    def __post_init__(self) -> None:
        check_choices(self)
        if not 0 < self.port < 65536:
            raise ConfigError("port", f"{self.port} must be within 1..65535")
        for name in ("replicas", "max_batch", "max_ongoing_requests"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"{getattr(self, name)} must be >= 1")
        if self.max_queued_requests < -1 or self.max_queued_requests == 0:
            raise ConfigError("max_queued_requests", "must be >= 1, or -1 for no bound")
        if self.threads < 0 or self.cpus_per_replica < 0:
            raise ConfigError("threads", "threads and cpus_per_replica must be >= 0")
        if self.batch_wait_s < 0 or self.poll_seconds < 0:
            raise ConfigError("batch_wait_s", "batch_wait_s and poll_seconds must be >= 0")
        if self.token_env is not None and self.token_file is not None:
            raise ConfigError("token_file", "give token_env or token_file, not both")
        if self.autoscaling is not None and self.replicas != 1:
            raise ConfigError("replicas", "autoscaling sets the replicas: leave replicas at 1")
