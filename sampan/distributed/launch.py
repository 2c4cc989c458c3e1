"""``sampan launch``: start N ranks per node through torchrun, with sampan's defaults.

    sampan launch --nproc_per_node 2 train.py --lr 3e-4                     # one node
    sampan launch --nproc_per_node 2 --max_restarts 3 train.py             # restart the group on a failure
    sampan launch --nproc_per_node 8 --nnodes 2 --rdzv_endpoint HOST:29400 train.py   # on each node
    sampan launch --nproc_per_node 8 --nnodes 2 --node_rank R --master_addr HOST --master_port 29500 train.py
    sampan launch --nproc_per_node 2 -m sampan.cli bench comm              # a module, as python -m

A thin front over torch's elastic launcher (``torch.distributed.run``, i.e. torchrun). What sampan
adds on top:

* ``OMP_NUM_THREADS=1`` per worker when it is unset (N ranks with all cores each oversubscribe the
  machine), announced once by the launcher instead of by every rank.
* ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` when ``max_restarts > 0``, without which elastic restart
  fails on gloo (see ``elastic_env``).
* ``--standalone`` (a private rendezvous on a free local port) for one node with no endpoint given.
* torchrun's ``--master_addr`` / ``--master_port`` with torchrun's meaning: the address and port of
  the static rendezvous's master (node rank 0 hosts a TCP store there, and every worker sees them
  as ``MASTER_ADDR`` / ``MASTER_PORT``). As in torchrun, the address defaults to 127.0.0.1, the
  port to 29500 on several nodes, and one node given only an address gets the private rendezvous.
* Errors for impossible input before any process starts.

torchrun runs in this process (``torch.distributed.run.main(argv)``), not as ``python -m
torch.distributed.run`` in a child: one interpreter and one ``import torch`` fewer (~1.5 s of a
~3 s two-rank job here), Ctrl-C and SIGTERM reach torchrun's agent directly (it stops the workers),
and a failed worker comes back as an exception we turn into an exit code.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sampan.utils.flags import SWITCH

NPROC_WORDS = ("auto", "cpu", "gpu")


def parse_nnodes(nnodes: str | int) -> tuple[int, int]:
    """``"M"`` or ``"MIN:MAX"`` (an elastic node count) -> (min, max); a clear error otherwise."""
    text = str(nnodes)
    parts = text.split(":")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or any(v <= 0 for v in values) or values[0] > values[-1]:
        raise ValueError(f"--nnodes {text!r} must be a positive count M or a range MIN:MAX with 1 <= MIN <= MAX")
    return values[0], values[-1]


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--rdzv_endpoint {endpoint!r} must be HOST:PORT (e.g. 10.0.0.1:29400)")
    return host, int(port)


@dataclass
class LaunchConfig:
    """What ``sampan launch`` was asked to run. ``validate()`` checks it; ``torchrun_argv()`` translates it.

    Fields:
        script: the Python script every rank runs (must exist).
        script_args: arguments passed through to the script untouched.
        nproc_per_node: ranks on this node: a positive count, or "auto" / "cpu" / "gpu" (torchrun's
            words: one per GPU if there are GPUs else one per CPU; one per CPU; one per GPU).
        nnodes: number of nodes, "M" or "MIN:MAX" for an elastic range.
        node_rank: this node's fixed rank; given, it selects torchrun's static rendezvous (ranks
            fixed, master at ``rdzv_endpoint`` or ``master_addr:master_port``), which cannot
            restart. None: the elastic c10d rendezvous numbers the nodes itself; on one node given
            ``master_port``, node 0 (torchrun's default).
        rdzv_endpoint: HOST:PORT of the rendezvous (the c10d store, or the static master).
        master_addr, master_port: torchrun's names for the static rendezvous's master, an
            alternative to ``rdzv_endpoint`` (not together with it). A port, or an address on
            several nodes, selects the static rendezvous; None: 127.0.0.1 and 29500, torchrun's
            defaults. One node with only ``master_addr`` gets the private rendezvous, as in torchrun.
        rdzv_id: a job id shared by all nodes of one job (c10d rendezvous).
        max_restarts: how many times to restart the whole group after a worker fails.
        standalone: a private single-node rendezvous on a free port (the default for one node
            without an endpoint).
        log_dir: where torchrun keeps each worker's logs (None: a temp dir).
        module: ``script`` is a module name, run as ``python -m script``.
        local_addr: the address other nodes reach this node's ranks at (multi-node). None: the
            address this node itself uses to reach ``rdzv_endpoint`` (torchrun's default, the
            hostname, can resolve to an address the other nodes cannot reach).
    """

    script: str
    script_args: list[str] = field(default_factory=list)
    nproc_per_node: int | str = 1
    nnodes: str = "1"
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    max_restarts: int = 0
    standalone: bool = field(default=False, metadata={SWITCH: True})
    log_dir: str | None = None
    module: bool = field(default=False, metadata={SWITCH: True})  # -m SCRIPT: SCRIPT is not the bool
    local_addr: str | None = None
    master_addr: str | None = None
    master_port: int | None = None

    def validate(self) -> LaunchConfig:
        nproc = str(self.nproc_per_node)
        if nproc not in NPROC_WORDS:
            try:
                count = int(nproc)
            except ValueError:
                raise ValueError(f"--nproc_per_node {nproc!r} must be a positive integer or one of "
                                 f"{', '.join(NPROC_WORDS)}") from None
            if count <= 0:
                raise ValueError(f"--nproc_per_node must be a positive number of ranks per node, got {count}")
        _, max_nodes = parse_nnodes(self.nnodes)
        if self.max_restarts < 0:
            raise ValueError(f"--max_restarts must be >= 0, got {self.max_restarts}")
        if self.rdzv_endpoint is not None:
            parse_endpoint(self.rdzv_endpoint)
        master = self.master_addr is not None or self.master_port is not None
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ValueError(f"--master_port must be in [1, 65535], got {self.master_port}")
        if self.master_addr is not None and not self.master_addr.strip():
            raise ValueError("--master_addr must be a host name or address (node 0's), got an empty string")
        if master and self.rdzv_endpoint:
            # torchrun would silently ignore --master_addr / --master_port here.
            raise ValueError("--master_addr/--master_port and --rdzv_endpoint both name the rendezvous; give the "
                             "rendezvous once: --master_addr/--master_port (static, torchrun's default) or "
                             "--rdzv_endpoint HOST:PORT")
        if self.standalone and (max_nodes > 1 or self.rdzv_endpoint or self.node_rank is not None or master):
            raise ValueError("--standalone is for one node with a private rendezvous; drop it, or drop "
                             "--nnodes > 1 / --rdzv_endpoint / --node_rank / --master_addr / --master_port")
        if max_nodes > 1 and not self.rdzv_endpoint and not self.master_addr:
            if self.master_port is not None:
                raise ValueError(f"--nnodes {self.nnodes} with --master_port needs --master_addr, node 0's address, "
                                 "the same on every node (torchrun's default 127.0.0.1 reaches no other node)")
            raise ValueError(f"--nnodes {self.nnodes} needs --rdzv_endpoint HOST:PORT, the same on every node "
                             "(a host all nodes can reach, e.g. node 0's address), or torchrun's static "
                             "--master_addr HOST [--master_port PORT] with --node_rank")
        if max_nodes > 1 and self.master_addr and self.node_rank is None:
            raise ValueError(f"--master_addr on --nnodes {self.nnodes} (static rendezvous) needs this node's "
                             f"--node_rank: 0 on the master node, 1..{max_nodes - 1} on the others")
        if self.uses_static:
            flag = "--node_rank" if self.node_rank is not None else "--master_addr/--master_port"
            if self.node_rank is not None and not 0 <= self.node_rank < max_nodes:
                raise ValueError(f"--node_rank {self.node_rank} must be in [0, {max_nodes}) for --nnodes {self.nnodes}")
            if max_nodes > 1 and ":" in str(self.nnodes):
                raise ValueError(f"{flag} (static rendezvous) needs a fixed --nnodes M, not a range")
            if self.max_restarts > 0:
                raise ValueError(f"{flag} selects the static rendezvous, which cannot restart a failed group; "
                                 f"drop {flag} (the c10d rendezvous of --rdzv_endpoint, or one node's private "
                                 "one, can) or --max_restarts")
        if self.module:
            try:
                found = importlib.util.find_spec(self.script) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                raise ValueError(f"module {self.script!r} is not importable here (-m runs `python -m {self.script}`)")
        elif not Path(self.script).is_file():
            raise FileNotFoundError(f"script {self.script!r} does not exist (or is not a file); "
                                    "give the path of the Python file every rank should run")
        return self

    @property
    def use_standalone(self) -> bool:
        _, max_nodes = parse_nnodes(self.nnodes)
        # One node with a master address but no port: torchrun, too, falls back to a private
        # rendezvous on a free port (torch.distributed.run.run), so the address does not matter.
        return self.standalone or (max_nodes == 1 and not self.rdzv_endpoint and self.node_rank is None
                                   and self.master_port is None)

    @property
    def uses_static(self) -> bool:
        """Whether torchrun's static rendezvous runs (fixed node ranks, master at one address)."""
        chosen = self.node_rank is not None or self.master_addr is not None or self.master_port is not None
        return chosen and not self.use_standalone

    def static_master(self) -> tuple[str, int]:
        """HOST, PORT of the static rendezvous's master: ``rdzv_endpoint``, else the master flags
        with torchrun's defaults (127.0.0.1, 29500)."""
        if self.rdzv_endpoint:
            return parse_endpoint(self.rdzv_endpoint)
        return self.master_addr or "127.0.0.1", 29500 if self.master_port is None else self.master_port

    def node_address(self) -> str | None:
        """``local_addr``, or the address this node uses to reach the rendezvous (None if unknown)."""
        if self.local_addr:
            return self.local_addr
        if self.rdzv_endpoint:
            return route_address(*parse_endpoint(self.rdzv_endpoint))
        if self.uses_static and self.master_addr:
            return route_address(*self.static_master())
        return None

    def torchrun_argv(self) -> list[str]:
        """The argument list for ``torch.distributed.run.main``."""
        argv = [f"--nproc_per_node={self.nproc_per_node}", f"--max_restarts={self.max_restarts}"]
        if self.use_standalone:
            argv.append("--standalone")
        else:
            argv.append(f"--nnodes={self.nnodes}")
            if self.uses_static:
                host, port = self.static_master()
                argv += ["--rdzv_backend=static", f"--node_rank={self.node_rank or 0}",
                         f"--master_addr={host}", f"--master_port={port}"]
            else:
                argv += ["--rdzv_backend=c10d", f"--rdzv_endpoint={self.rdzv_endpoint}"]
                local = self.node_address()
                if local:
                    argv.append(f"--local_addr={local}")
                if is_local_address(parse_endpoint(self.rdzv_endpoint)[0]):
                    # torchrun decides who hosts the c10d store by comparing the endpoint with this
                    # machine's *hostname*; a node whose endpoint address belongs to another interface
                    # (a second NIC, a network namespace) would otherwise wait as a client forever.
                    argv.append("--rdzv_conf=is_host=1")
                if self.rdzv_id:
                    argv.append(f"--rdzv_id={self.rdzv_id}")
        if self.log_dir:
            argv.append(f"--log_dir={self.log_dir}")
        if self.module:
            argv.append("--module")
        return [*argv, self.script, *self.script_args]


def is_local_address(host: str) -> bool:
    """Whether ``host`` is an address of one of this machine's interfaces (a socket can bind to it)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.bind((address[0], 0))
            return True
        except OSError:
            continue
    return False


def route_address(host: str, port: int) -> str | None:
    """The local address this machine sends from to reach ``host:port`` (no packet is sent)."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, port))  # UDP: only picks the route and source address
            return sock.getsockname()[0]
    except OSError:
        return None


def interface_of(address: str) -> str | None:
    """The name of the network interface holding IPv4 ``address`` (Linux), or None."""
    import fcntl
    import socket
    import struct

    siocgifaddr = 0x8915  # <linux/sockios.h>: get an interface's IPv4 address
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # an interface without an IPv4 address
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def elastic_env(config: LaunchConfig, environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Environment variables to add for this launch, and the notes to print about them.

    Only variables the user has not set are added; theirs always win.
    """
    add: dict[str, str] = {}
    notes: list[str] = []
    if "OMP_NUM_THREADS" not in environ:
        add["OMP_NUM_THREADS"] = "1"
        notes.append("OMP_NUM_THREADS is not set: using 1 thread per rank (set OMP_NUM_THREADS to change it)")
    if config.max_restarts > 0 and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in environ:
        # Elastic restart on gloo is broken by default (pytorch/pytorch#135712, #167288): the c10d
        # rendezvous shares its TCP store with the workers, and after a restart the new workers
        # read the previous attempt's gloo addresses and fail in init_process_group with
        # "Gloo connectFullMesh failed ... Connection refused". With the store not shared, each
        # rendezvous round hands the workers a fresh store and the restarted group comes up
        # (measured here: 4/4 restarts; the alternative fix, a PrefixStore per
        # TORCHELASTIC_RESTART_COUNT in every worker, would need every user script to do it).
        add["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    _, max_nodes = parse_nnodes(config.nnodes)
    if max_nodes > 1 and "GLOO_SOCKET_IFNAME" not in environ:
        # gloo finds its own address from the hostname, which may resolve to an interface the other
        # nodes cannot reach (a second NIC, a container or namespace): bind it to the one that
        # carries traffic to the rendezvous instead.
        address = config.node_address()
        interface = interface_of(address) if address else None
        if interface and interface != "lo":
            add["GLOO_SOCKET_IFNAME"] = interface
            notes.append(f"GLOO_SOCKET_IFNAME is not set: using {interface} ({address}), the interface that "
                         "reaches the rendezvous endpoint")
    return add, notes


@contextmanager
def _patched_environ(add: Mapping[str, str]) -> Iterator[None]:
    """Set ``add`` in ``os.environ`` (torchrun copies it into the workers) and undo it afterwards."""
    old = {key: os.environ.get(key) for key in add}
    os.environ.update(add)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def launch(config: LaunchConfig) -> int:
    """Run ``config`` under torchrun in this process; the exit code (0 when every rank succeeded)."""
    config.validate()
    add, notes = elastic_env(config, os.environ)
    if config.master_addr is not None and config.use_standalone:
        notes.append(f"--master_addr {config.master_addr} without --master_port on one node: a private rendezvous "
                     "on a free port, as torchrun does (give --master_port to put the master at ADDR:PORT)")
    for note in notes:
        print(f"sampan launch: {note}", file=sys.stderr)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    with _patched_environ(add):
        try:
            torchrun_main(config.torchrun_argv())
        except ChildFailedError as err:
            # torchrun has already printed the failing rank's error summary.
            failures = list(err.failures.values())
            code = failures[0].exitcode if failures else 1
            return code if isinstance(code, int) and code > 0 else 1
        except SignalException as err:
            print(f"sampan launch: stopped by signal {err.sigval.name}; workers were terminated", file=sys.stderr)
            return 128 + int(err.sigval)
    return 0
