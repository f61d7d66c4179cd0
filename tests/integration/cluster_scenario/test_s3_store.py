"""The object store on the services host, used from the other hosts with the keys of their
environment, and refused to anyone else."""

from __future__ import annotations

import json

import pytest
from helpers.cluster_scenario import HOSTS
from helpers.netns_cluster import Cluster, command_lines_with, user_of

# The scenario's limit (test_dead_host.py), should the cluster come up for this file alone.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]


STORE_CHECK = r"""
import json, os, socket, sys, uuid
import pyarrow as pa, pyarrow.fs as pafs, pyarrow.parquet as pq, ray

endpoint = os.environ["AWS_ENDPOINT_URL"].removeprefix("http://")


def store(**keys):
    # The keys from this process's environment unless given (the AWS SDK's own chain).
    return pafs.S3FileSystem(endpoint_override=endpoint, scheme="http",
                             region=os.environ["AWS_REGION"], connect_timeout=3,
                             request_timeout=10, **keys)


def refused(fs, path):
    try:
        fs.open_input_file(path).read()
    except OSError as exc:
        return str(exc).splitlines()[0][:120]
    return None


@ray.remote(num_cpus=0.5, scheduling_strategy="SPREAD")
def read_on_a_worker(path):
    return ray.util.get_node_ip_address(), pq.read_table(path, filesystem=store()).to_pydict()


path = f"tfm/cluster-check/{uuid.uuid4().hex}.parquet"
table = pa.table({"src_ids": [[1, 2, 3], [4]], "tgt_ids": [[5], [6, 7]]})
pq.write_table(table, path, filesystem=store())
ray.init(logging_level="ERROR")
workers = ray.get([read_on_a_worker.remote(path) for _ in range(2)])
host, port = endpoint.split(":")
try:
    socket.create_connection((host, int(sys.argv[1])), timeout=3).close()
    filer = "open"
except OSError as exc:
    filer = type(exc).__name__
wrong_secret = store(access_key=os.environ["AWS_ACCESS_KEY_ID"], secret_key="wrong" * 6)
out = {"read_here": pq.read_table(path, filesystem=store()).to_pydict() == table.to_pydict(),
       "workers": [(ip, rows == table.to_pydict()) for ip, rows in workers],
       "wrong_secret": refused(wrong_secret, path),
       "anonymous": refused(store(anonymous=True), path), "filer_from_here": filer}
store().delete_file(path)
print("RESULT " + json.dumps(out))
"""


def test_the_services_host_serves_s3_to_its_keys_only(cluster: Cluster):
    """The object store on ``services``, used from other hosts: a driver on ``head`` writes and
    reads Parquet with the keys of its environment, and Ray workers on the worker hosts read it
    with theirs; a wrong secret and an anonymous client are refused; only the S3 gateway is on
    the services address (its master, volume and filer on the host's loopback), weed runs as
    ``tfm-s3``, and no key is on any process's command line."""
    s3_port = int(cluster.info["urls"]["s3"].rsplit(":", 1)[1])
    done = cluster.run("head", "python", "-c", STORE_CHECK, str(s3_port + 3), timeout=300)
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["read_here"], result
    assert {ip for ip, _ in result["workers"]} <= {cluster.host("w1"), cluster.host("w2")}, result
    assert all(same for _, same in result["workers"]), result
    assert result["wrong_secret"] and result["anonymous"], result
    assert result["filer_from_here"] == "ConnectionRefusedError", result
    weed = [
        (address, port, pid)
        for address, port, pid, cmd in cluster.listening("services")
        if "weed server" in cmd
    ]
    assert {(a, p) for a, p, _ in weed if a not in ("127.0.0.1", "::1")} == {
        (cluster.host("services"), s3_port),
        (cluster.host("services"), s3_port + 10_000),
    }, weed
    assert {user_of(pid) for _, _, pid in weed} == {"tfm-s3"}, weed
    pids = [pid for host in HOSTS for pid in cluster.pids(host)]
    assert command_lines_with(pids, cluster.secrets()) == []
