"""One peer process: identity, DHT node, TLS links, membership, actor host, requester.

A :class:`Node` is what ``swarm join`` runs (worker role) and what a client embeds
(requester role). It wires the sans-IO parts to the network:

- its :class:`~identity.keys.PeerKey` comes from the data dir (``peer.key``, 0600);
- a :class:`~dht.DHTNode` joins through bootstrap addresses; the node announces its
  :class:`~swarm.control.membership.MemberRecord` under the swarm's topic and re-announces it;
- a worker listens for TLS links and serves tasks on them with an
  :class:`~swarm.runtime.host.ActorHost`; a requester dials workers found in the member list
  and runs jobs with a :class:`~swarm.runtime.requester.Requester`.

Hooks for the control plane (all optional, all on the instance):

``accept_peer(peer_id) -> bool``
    consulted for every incoming link (after the TLS handshake) and before any shard is
    scheduled on a peer: return False for kicked or blocked peers.
``on_control(message_type, handler)``
    route a wire message type arriving on any link to ``handler(link, msg)`` (sync or async).
``on_lying_peer(callback)``
    ``callback(peer_id, reason)`` runs whenever a peer's result fails verification
    (:meth:`report_lying_peer` runs them; the control plane may block repeat offenders).
``members()``, ``send_control(peer, msg)``, ``link_to(peer)``
    the live member list, and a way to reach any member over a link.

A plain worker process (no control plane): ``python -m swarm.local_worker``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dht import DHTNode
from dht.validators import Validator
from identity.keys import PeerId, PeerKey
from swarm import __version__, wire
from swarm.control.membership import (
    ACTIVITY_INTERVAL,
    MemberRecord,
    announce,
    live_members,
    read_health,
)
from swarm.errors import ConfigError, LinkClosed
from swarm.links import tls
from swarm.links.base import PeerLink
from swarm.runtime.chaos import ChaosSpec
from swarm.runtime.host import ActorHost
from swarm.runtime.requester import Requester

log = logging.getLogger("swarm.node")
KEY_FILE = "peer.key"
ControlHandler = Callable[[PeerLink, wire.Message], Awaitable[None] | None]


@dataclass
class NodeConfig:
    """How to run one node."""

    data_dir: Path
    """Keys and DHT state (created 0700)."""
    swarm_id: bytes
    """The 20-byte swarm id (see :func:`swarm.control.membership.swarm_id`)."""
    roles: tuple[str, ...] = ("worker",)
    """"worker" serves tasks; "requester" submits them."""
    host: str = "127.0.0.1"
    """Address to bind and announce."""
    dht_port: int = 0
    """UDP port of the DHT node (0 = any free one)."""
    link_port: int = 0
    """TCP port of the TLS listener (0 = any free one)."""
    bootstrap: tuple[tuple[str, int], ...] = ()
    """DHT nodes to join through."""
    backend: str = "auto"
    """Compute backend name for a worker (see ``compute.get_backend``)."""
    threads: int | None = None
    """BLAS threads for a numpy backend (None = library default)."""
    store_capacity: int = 4 << 30
    """Object store cap in bytes."""
    chaos: ChaosSpec = field(default_factory=ChaosSpec)
    """Fault injection (``SWARM_CHAOS``)."""
    announce_ttl: float = 120.0
    """Membership announcement lifetime; re-announced at a third of it."""
    announce: bool = True
    """Announce a member record (a transient requester such as ``swarm submit`` does not)."""
    dht_rpc_timeout: float = 5.0
    """Seconds a DHT request waits for an answer (a dead node costs this per lookup)."""
    bench_sizes: tuple[int, ...] | None = None
    """Matrix sizes of the start-up benchmark behind the announced TFLOPS (None: compute's
    quick set, ~3 s)."""
    bench_budget_s: float = 3.0
    """Time budget of that benchmark."""
    listen: bool | None = None
    """Take incoming TLS links (None: when a worker). A non-worker that listens serves only
    control messages on them (a coordinator that is not a worker, say)."""
    validators: Mapping[bytes, Validator] = field(kw_only=True)
    """DHT item validators by salt, installed before the node serves anything: every node
    refuses forged swarm items (pass :func:`swarm.control.charter.validators`; required so
    that no caller forgets it)."""


class Node:
    """One peer (see module docstring for the hooks)."""

    def __init__(self, config: NodeConfig, key: PeerKey | None = None) -> None:
        if len(config.swarm_id) != 20:
            raise ConfigError("a swarm id is 20 bytes")
        self.config = config
        data = Path(config.data_dir)
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.key = key or PeerKey.load_or_create(data / KEY_FILE)
        self.peer_id: PeerId = self.key.peer_id
        self.dht = DHTNode(self.key, data / "dht", maintenance_interval=30.0,
                           rpc_timeout=config.dht_rpc_timeout)
        for salt, validator in config.validators.items():
            self.dht.register_validator(salt, validator)  # refuse forged swarm items
        self.accept_peer: Callable[[PeerId], bool] = lambda peer: True
        self._control: dict[type, ControlHandler] = {}
        self._liar_callbacks: list[Callable[[PeerId, str], None]] = []
        self.requester = Requester(self.peer_id, accept_peer=self._accepts,
                                   on_rejected=self.report_lying_peer)
        self.host: ActorHost | None = None
        self.server: tls.TLSServer | None = None
        self.tflops = 0.0
        self._incoming: dict[PeerId, PeerLink] = {}
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self.record: MemberRecord | None = None

    # -- hooks ----------------------------------------------------------------------------

    def _accepts(self, peer: PeerId) -> bool:
        try:
            return bool(self.accept_peer(peer))
        except Exception:
            log.exception("accept_peer hook failed; refusing %s", peer.short())
            return False

    def on_control(self, message_type: type, handler: ControlHandler) -> None:
        """Send messages of ``message_type`` arriving on any link to ``handler(link, msg)``."""
        self._control[message_type] = handler

    def on_lying_peer(self, callback: Callable[[PeerId, str], None]) -> None:
        """Call ``callback(peer, reason)`` for each result that failed verification."""
        self._liar_callbacks.append(callback)

    def report_lying_peer(self, peer: PeerId, reason: str) -> None:
        """A peer returned a wrong result: tell every registered callback."""
        for cb in self._liar_callbacks:
            try:
                cb(peer, reason)
            except Exception:
                log.exception("on_lying_peer callback failed")

    async def _dispatch(self, link: PeerLink, msg: wire.Message) -> None:
        handler = self._control.get(type(msg))
        if handler is None:
            log.debug("no handler for %s from %s", type(msg).__name__, link.remote.short())
            return
        result = handler(link, msg)
        if inspect.isawaitable(result):
            await result

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        await self.dht.listen(cfg.dht_port, cfg.host)
        if cfg.bootstrap:
            await self.dht.bootstrap(list(cfg.bootstrap))
        links: tuple[tuple[str, int], ...] = ()
        if "worker" in cfg.roles:
            import compute

            backend = await asyncio.to_thread(compute.get_backend, cfg.backend,
                                              threads=cfg.threads)
            result = await asyncio.to_thread(
                compute.benchmark, cfg.bench_sizes, cfg.bench_budget_s,
                quick=cfg.bench_sizes is None, backends=[backend.name], threads=cfg.threads)
            self.tflops = compute.measured_tflops(result)
            self.host = ActorHost(backend, store_capacity=cfg.store_capacity, chaos=cfg.chaos)
        if cfg.listen or (cfg.listen is None and "worker" in cfg.roles):
            self.server = await tls.listen(self.key, cfg.host, cfg.link_port,
                                           on_link=self._serve, accept=self._accepts)
            links = ((cfg.host, self.server.port),)
        self.record = MemberRecord(self.peer_id, self.tflops, links, self.dht.address,
                                   __version__, tuple(cfg.roles), read_health())
        if cfg.announce:
            await announce(self.dht, cfg.swarm_id, self.record, cfg.announce_ttl)
            self._spawn(self._reannounce())
        log.info("node %s up: dht %s, links %s, roles %s", self.peer_id.short(),
                 self.dht.address, links, ",".join(cfg.roles))

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reannounce(self) -> None:
        """Re-announce every ``announce_ttl / 3`` s, and within ACTIVITY_INTERVAL s of a
        change in the work this worker runs (rate-bounded), so status shows running jobs."""
        period = self.config.announce_ttl / 3
        changed = self.host.changed if self.host is not None else None
        last = time.monotonic()
        while True:
            left = last + period - time.monotonic()
            if changed is None:
                await asyncio.sleep(max(0.0, left))
            else:
                try:
                    await asyncio.wait_for(changed.wait(), max(0.0, left))
                except TimeoutError:
                    pass
                if changed.is_set():
                    changed.clear()
                    if (self._activity() == (self.record.tasks, self.record.serving)
                            and time.monotonic() < last + period):
                        continue
                    await asyncio.sleep(max(0.0, last + ACTIVITY_INTERVAL - time.monotonic()))
            try:
                tasks, serving = self._activity()
                self.record = MemberRecord(self.peer_id, self.tflops, self.record.links,
                                           self.dht.address, __version__,
                                           self.record.roles, read_health(),
                                           tasks=tasks, serving=serving)
                await announce(self.dht, self.config.swarm_id, self.record,
                               self.config.announce_ttl)
            except Exception as exc:  # the DHT may be unreachable for a while
                log.warning("re-announce failed: %s", exc)
            last = time.monotonic()

    def _activity(self) -> tuple[int, tuple[tuple[PeerId, int], ...]]:
        if self.host is None:
            return 0, ()
        tasks, per = self.host.activity()
        return tasks, tuple(per)

    async def _serve(self, link: PeerLink) -> None:
        self._incoming[link.remote] = link
        try:
            if self.host is not None:
                await self.host.serve(link, fallback=self._dispatch)
            else:
                async for msg in link:
                    await self._dispatch(link, msg)
        finally:
            if self._incoming.get(link.remote) is link:
                del self._incoming[link.remote]

    async def stop(self, graceful: bool = True, timeout: float = 30.0) -> None:
        """Leave: finish the running task (graceful) and hand queued ones back, then close."""
        if self._stopping:
            return
        self._stopping = True
        if self.host is not None and graceful:
            await self.host.drain(timeout)
        if self.server is not None:
            await self.server.close()
        for task in list(self._tasks):
            task.cancel()
        await self.requester.close()
        for link in list(self._incoming.values()):
            await link.close("node stopping")
        if self.host is not None:
            await self.host.close()
        await self.dht.stop()

    # -- members and links ----------------------------------------------------------------

    async def members(self) -> list[MemberRecord]:
        """Live members of the swarm (this node included once it announced)."""
        return await live_members(self.dht, self.config.swarm_id)

    async def connect_workers(self, records: Sequence[MemberRecord] | None = None
                              ) -> list[PeerId]:
        """Dial every live, accepted worker we have no link to; returns the linked workers."""
        if records is None:
            records = await self.members()
        dials = [r for r in records if "worker" in r.roles and r.links
                 and r.peer_id != self.peer_id and self._accepts(r.peer_id)
                 and (r.via is None or self._accepts(r.via))
                 and r.peer_id not in self.requester.links]

        async def dial(r: MemberRecord) -> None:
            for host, port in r.links:
                try:
                    if r.via is not None:  # a browser tab: through the node that serves it
                        from swarm.web.relay import dial as relay_dial

                        link = await relay_dial(self.key, host, port, r.via, r.peer_id)
                    else:
                        link = await tls.connect(self.key, host, port, r.peer_id)
                except (OSError, TimeoutError, LinkClosed) as exc:
                    log.info("cannot reach %s at %s:%d: %s", r.peer_id.short(), host, port, exc)
                    continue
                except Exception as exc:  # AuthenticationError, ProtocolError
                    log.warning("refusing %s at %s:%d: %s", r.peer_id.short(), host, port, exc)
                    continue
                self.requester.attach(link, fallback=self._dispatch)
                return

        await asyncio.gather(*(dial(r) for r in dials))
        return self.requester.workers()

    async def wait_for_workers(self, count: int, timeout: float) -> list[PeerId]:
        """Poll the member list until ``count`` workers are linked (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout):
            delay = 0.05
            while True:
                linked = await self.connect_workers()
                if len(linked) >= count:
                    return linked
                await asyncio.sleep(delay)  # members appear through the DHT: poll, backing off
                delay = min(delay * 2, 1.0)

    def link_to(self, peer: PeerId) -> PeerLink | None:
        """An open link to ``peer`` in either direction, if any."""
        for link in (self.requester.links.get(peer), self._incoming.get(peer)):
            if link is not None and not link.closed:
                return link
        return None

    async def send_control(self, peer: PeerId, msg: wire.Message) -> None:
        """Send a control message to a member, dialing it if no link is open."""
        link = self.link_to(peer)
        if link is None:
            records = [r for r in await self.members() if r.peer_id == peer]
            if not records or not records[0].links:
                raise LinkClosed(f"{peer.short()} is not a reachable member")
            host, port = records[0].links[0]
            link = await tls.connect(self.key, host, port, peer)
            self.requester.attach(link, fallback=self._dispatch)
        await link.send(msg)
