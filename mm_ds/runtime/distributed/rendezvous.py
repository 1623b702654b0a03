"""Where the ranks meet: rank 0's store on MASTER_ADDR, every rank's join record in it, rank 0's verdict on who came,
and the process group over that store. mm_ds/runtime/distributed/bringup.py holds the rules (from strings: which rank
this is, where to listen, what to say when ranks are missing); this module the sockets and the store.
mm_ds/runtime/distributed/dist.py's `init` calls it, and stays the only module that calls a collective (this one makes
the store and the group; tests/test_dist.py keeps it so).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
from datetime import timedelta

import torch

from ...config import ConfigError, LaunchConfig
from . import bringup
from .bringup import free_port

_STORE = None  # rank 0's rendezvous store (`meet`)


def store():
    """Rank 0's rendezvous store once the ranks met here (`meet`); None before, or where DeepSpeed made the group."""
    return _STORE


class RendezvousFailed(ConfigError):
    """The ranks did not all meet, or met in a way that cannot work (two on one GPU): every rank that came stops
    with the reason, within launch.rendezvous_timeout_s."""


def adopt_env() -> bringup.Place:
    """This rank's place (mm_ds/runtime/distributed/bringup.py) as torch.distributed's env:// variables: RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT. Outside any launcher, a world of one on 127.0.0.1."""
    here = bringup.place(bringup.given_env())
    if here is None:
        here = bringup.Place("none", 0, 1, 0, 1, "127.0.0.1", int(os.environ.get("MASTER_PORT") or free_port()))
    if here.note and here.rank == 0:
        print(f"[mm-ds] {here.note}", flush=True)
    if here.master_addr is None:
        here = dataclasses.replace(here, master_addr=bringup.told_through_mpi(here))
    os.environ.update(RANK=str(here.rank), WORLD_SIZE=str(here.world), LOCAL_RANK=str(here.local_rank),
                      MASTER_ADDR=here.master_addr, MASTER_PORT=str(here.master_port))
    if here.local_world:
        os.environ["LOCAL_WORLD_SIZE"] = str(here.local_world)
    return here


def set_device(local_rank: int) -> int:
    """Make this rank's GPU current: its local rank among the devices it can see. Under `srun --gpus-per-task=1`
    (or `--gpu-bind`) a task sees one device while SLURM_LOCALID counts the node's tasks; LOCAL_RANK is then
    made that index too, since DeepSpeed's engine takes LOCAL_RANK as its device (and checks it against
    OMPI_COMM_WORLD_LOCAL_RANK). Two ranks of a node on one device stopped the launch before (`_join`)."""
    index = local_rank % max(1, torch.cuda.device_count())
    if index != local_rank:
        os.environ["LOCAL_RANK"] = str(index)
        if "OMPI_COMM_WORLD_LOCAL_RANK" in os.environ:
            os.environ["OMPI_COMM_WORLD_LOCAL_RANK"] = str(index)
    torch.cuda.set_device(index)
    return index


_RENDEZVOUS_SOCKET = None
_JOIN = "mm_ds/join/"
_MEMBERS: list[dict] = []  # rank 0: every rank's join record (`members`)
_SEEN_AS = "mm_ds/master_addr_seen_from_other_nodes"


def meet(here: bringup.Place, launch: LaunchConfig):
    """Rank 0's store, on MASTER_ADDR (`_listen`), with every rank in it (`_join`) within
    launch.rendezvous_timeout_s: a rank whose rank 0 never came up, or a rank 0 some of whose ranks never did,
    stops then, naming what is missing, instead of waiting out the collective timeout."""
    global _STORE
    from deepspeed.accelerator import get_accelerator

    wait = timedelta(seconds=launch.rendezvous_timeout_s)
    addr, port, spans = here.master_addr, here.master_port, (here.local_world or 0) < here.world
    fd = _listen(addr, port, here.world, spans) if here.rank == 0 else None
    try:
        store = torch.distributed.TCPStore(addr, port, here.world, here.rank == 0, wait, wait_for_workers=False,
                                           master_listen_fd=fd)
    except RuntimeError as e:
        raise RendezvousFailed(f"rank {here.rank}: rank 0's rendezvous at {addr}:{port} did not answer in "
                               f"{launch.rendezvous_timeout_s} s ({str(e).splitlines()[0]}): rank 0 never started "
                               f"(its node's output says why), or {addr} is not rank 0's address as this node "
                               f"reaches it (launch.master_addr)") from None
    _STORE = store
    _join(store, here, _record(here), launch)
    if get_accelerator().communication_backend_name() == "gloo" and here.local_world is not None and spans \
            and not bringup.is_loopback(addr):
        _gloo_interface(store, addr, wait)
    return store


def _listen(addr: str, port: int, world: int, spans: bool) -> int:
    """Rank 0's listening socket, handed to the store (torch's own binds every interface whatever MASTER_ADDR
    says): MASTER_ADDR's address, or every interface where other nodes may reach the name at another
    (bringup.listen_on)."""
    global _RENDEZVOUS_SOCKET
    try:
        resolved = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise ConfigError(f"MASTER_ADDR={addr} does not resolve on rank 0's node ({e}); give rank 0's address "
                          f"(launch.master_addr)") from None
    family, where, why = bringup.listen_on(addr, resolved, spans)
    if why:
        print(f"[mm-ds] MASTER_ADDR={addr} {why}: rank 0 listens on every interface", flush=True)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6 and where == "::":
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 peers too
    try:
        sock.bind((where, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"rank 0 cannot listen on MASTER_ADDR:MASTER_PORT={addr}:{port} ({e}); choose a free "
                          f"launch.master_port, and an address of rank 0's machine as launch.master_addr") from None
    sock.listen(max(128, world))
    _RENDEZVOUS_SOCKET = sock  # kept open for the life of the process group
    return sock.fileno()


def _record(here: bringup.Place) -> dict:
    """What a rank tells rank 0 when it joins: where it runs, and the GPU it is about to take."""
    device = None
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        index = here.local_rank % max(1, count)
        try:
            uuid = str(torch.cuda.get_device_properties(index).uuid)
        except (AttributeError, RuntimeError, AssertionError):
            uuid = ""
        device = {"count": count, "index": index, "uuid": uuid}
    return {"host": socket.gethostname(), "pid": os.getpid(), "local_rank": here.local_rank,
            "local_world": here.local_world, "threads": torch.get_num_threads(), "device": device}


def _join(store, here: bringup.Place, record: dict, launch: LaunchConfig) -> None:
    """Each rank puts its record in rank 0's store; rank 0 waits (launch.rendezvous_timeout_s) until all have,
    then rules for all (bringup.verdict: ranks that never came, two ranks on one GPU). On a bad verdict every
    rank that came stops with it, at once."""
    global _MEMBERS
    started, timeout_s = time.monotonic(), launch.rendezvous_timeout_s
    store.set(f"{_JOIN}{here.rank}", json.dumps(record))
    store.add(f"{_JOIN}count", 1)
    if here.rank == 0:
        while store.add(f"{_JOIN}count", 0) < here.world and time.monotonic() - started < timeout_s:
            time.sleep(0.05)
        keys = [f"{_JOIN}{r}" for r in range(here.world)]
        if store.add(f"{_JOIN}count", 0) == here.world:
            records = [json.loads(v) for v in store.multi_get(keys)]
        else:
            records = [json.loads(store.get(k)) if store.check([k]) else None for k in keys]
        _MEMBERS = records
        hosts = bringup.launch_hosts(launch) if None in records else None
        ruling = bringup.verdict(records, time.monotonic() - started, hosts)
        store.set(f"{_JOIN}verdict", ruling)
        if ruling:  # the others read it from this process's store: stay until they have (briefly)
            came, until = sum(r is not None for r in records), time.monotonic() + 10
            while store.add(f"{_JOIN}read", 0) < came - 1 and time.monotonic() < until:
                time.sleep(0.05)
        elif here.world > 1:
            print(f"[mm-ds] rendezvous: {here.world} ranks on {len({r['host'] for r in records})} node(s) at "
                  f"{here.master_addr}:{here.master_port} in {time.monotonic() - started:.1f} s", flush=True)
    else:
        try:
            store.wait([f"{_JOIN}verdict"], timedelta(seconds=timeout_s + 30))
            ruling = store.get(f"{_JOIN}verdict").decode()
            store.add(f"{_JOIN}read", 1)
        except RuntimeError as e:
            raise RendezvousFailed(f"rank {here.rank}: rank 0 gave no verdict on the rendezvous "
                                   f"({str(e).splitlines()[0]}): it stopped (its output says why)") from None
    if ruling:
        raise RendezvousFailed(f"rank {here.rank} stopped: {ruling}")


def members() -> list[dict]:
    """On rank 0, after `init`: every rank's join record (host, local rank and world, threads, device)."""
    return list(_MEMBERS)


def start_group(store, here: bringup.Place, launch: LaunchConfig) -> None:
    """The process group over the joined store, its collectives bounded by launch.collective_timeout_s."""
    from deepspeed.accelerator import get_accelerator

    timeout = timedelta(seconds=launch.collective_timeout_s)
    store.set_timeout(timeout)
    torch.distributed.init_process_group(get_accelerator().communication_backend_name(), store=store,
                                         rank=here.rank, world_size=here.world, timeout=timeout)


def _gloo_interface(store, addr: str, timeout) -> None:
    """gloo advertises to its peers the address this machine's host name resolves to: 127.0.1.1 on Debian-style
    hosts, which every other node dials as its own loopback. Unless GLOO_SOCKET_IFNAME names the interface,
    take the one this node reaches MASTER_ADDR through; on rank 0's node, where MASTER_ADDR itself may be
    loopback, the one holding the address the other nodes reached it at (their ranks put it in the store)."""
    master_ip = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)[0][4][0]
    with socket.socket(socket.AF_INET6 if ":" in master_ip else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master_ip, 9))  # sends nothing: the kernel picks the route and this end's address
        here = s.getsockname()[0]
    if not _loopback(here):
        store.set(_SEEN_AS, master_ip)  # every rank off rank 0's node, whatever it decides below
    try:
        first = socket.getaddrinfo(socket.gethostname(), None)[0][4][0]
    except OSError:
        first = "127.0.0.1"  # gloo falls back to loopback then
    if os.environ.get("GLOO_SOCKET_IFNAME") or not _loopback(first):
        return  # the user's choice, or gloo's own is an address other nodes can reach
    if _loopback(here):
        store.wait([_SEEN_AS], timeout)
        here = store.get(_SEEN_AS).decode()
    import psutil

    names = [n for n, addrs in psutil.net_if_addrs().items() if any(a.address.split("%")[0] == here for a in addrs)]
    if names:
        os.environ["GLOO_SOCKET_IFNAME"] = names[0]
    else:
        print(f"[mm-ds] gloo: no interface holds {here}; set GLOO_SOCKET_IFNAME to the one other nodes reach",
              file=sys.stderr, flush=True)


def _loopback(ip: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(ip.split("%")[0]).is_loopback
