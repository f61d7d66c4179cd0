"""The torch process group of a Ray Train run, bound to the address Ray gives each node.

Ray Train's own set-up (``TorchConfig``) leaves two things to the machine's defaults, and both
break across real hosts or expose a port:

- gloo (CPU) and NCCL (GPU) pick the interface of the host name's address, which Debian-style
  ``/etc/hosts`` maps to 127.0.0.1: the process group of workers on two hosts never forms
  (``Gloo connectFullMesh failed ... local=[127.0.0.1]``). Here every worker names the interface
  that carries its node's Ray address in ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME``
  (unless the node's environment already sets them).
- rank 0's ``TCPStore``, which has no authentication, listens on every interface. Here it
  listens on rank 0's node address only (127.0.0.1 for a local Ray bound to loopback), through
  a socket bound before the store takes it over (``master_listen_fd``).

A subclass of Ray's private ``_TorchBackend`` (ray 2.60): its ``on_start`` is the one place
where the process group is made, and Ray offers no hook for either setting.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

from ray.train._internal.base_worker_group import BaseWorkerGroup
from ray.train.torch import TorchConfig
from ray.train.torch.config import _TorchBackend

IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

_listener: socket.socket | None = None
"""Rank 0's bound, listening socket between ``open_store_socket`` and the store taking it."""


def interface_of(address: str) -> str | None:
    """The name of this machine's network interface that carries ``address``, or None."""
    import psutil

    wanted = ipaddress.ip_address(address)
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                if ipaddress.ip_address(entry.address.split("%")[0]) == wanted:
                    return name
            except ValueError:
                continue
    return None


def bind_collectives_to_node() -> dict[str, str]:
    """On a worker: name the interface of this node's Ray address for gloo and NCCL, unless the
    environment already names one. Returns the variables as they now are."""
    import ray

    address = ray.util.get_node_ip_address()
    name = interface_of(address)
    for variable in IFNAME_VARIABLES:
        if name is not None and not os.environ.get(variable):
            os.environ[variable] = name
    return {"node_address": address, **{v: os.environ.get(v, "") for v in IFNAME_VARIABLES}}


def open_store_socket() -> tuple[str, int]:
    """On rank 0: a socket listening on this node's Ray address, kept for the store; returns
    ``(address, port)`` for the other ranks."""
    import ray

    global _listener
    address = ray.util.get_node_ip_address()
    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind((address, 0))
    listener.listen(512)
    _listener = listener
    return address, listener.getsockname()[1]


def init_process_group(
    backend: str, world_rank: int, world_size: int, address: str, port: int, timeout_s: float
) -> None:
    """On every rank: the store (rank 0 serves it on the socket ``open_store_socket`` made),
    then the process group on it."""
    import torch.distributed as dist

    global _listener
    timeout = timedelta(seconds=timeout_s)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    if world_rank == 0:
        if _listener is None:
            raise RuntimeError("rank 0 has no store socket: open_store_socket did not run here")
        fd, _listener = _listener.detach(), None  # the store owns (and closes) the socket now
        store = dist.TCPStore(address, port, world_size, True, timeout, master_listen_fd=fd)
    else:
        store = dist.TCPStore(address, port, world_size, False, timeout)
    if backend == "nccl":
        # As Ray's own set-up does: a hung NCCL collective raises instead of blocking forever.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    dist.init_process_group(
        backend=backend, store=store, rank=world_rank, world_size=world_size, timeout=timeout
    )


class _NodeBoundBackend(_TorchBackend):
    """Ray Train's torch backend with the process group made by ``init_process_group``."""

    def on_start(self, worker_group: BaseWorkerGroup, backend_config: TorchConfig) -> None:
        import ray
        from ray.train.torch.config import _set_torch_distributed_env_vars

        backend = backend_config.backend
        if backend is None:
            backend = (
                "nccl" if worker_group.get_resources_per_worker().get("GPU", 0) > 0 else "gloo"
            )
        worker_group.execute(bind_collectives_to_node)
        address, port = worker_group.execute_single(0, open_store_socket)
        worker_group.execute(_set_torch_distributed_env_vars)  # RANK, LOCAL_RANK, ... as Ray sets
        world_size = len(worker_group)
        # The worker group's refs are typed as ray.types.ObjectRef, ray.get's overloads take the
        # other.
        # pyrefly: ignore[no-matching-overload]
        ray.get(
            [
                worker_group.execute_single_async(
                    rank,
                    init_process_group,
                    backend=backend,
                    world_rank=rank,
                    world_size=world_size,
                    address=address,
                    port=port,
                    timeout_s=backend_config.timeout_s,
                )
                for rank in range(world_size)
            ]
        )


@dataclass
class NodeBoundTorchConfig(TorchConfig):
    """``TorchConfig`` whose process group is bound to each node's Ray address (module doc)."""

    @property
    def backend_cls(self) -> type[_TorchBackend]:
        return _NodeBoundBackend
