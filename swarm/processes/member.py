"""Running one member of a swarm: node + charter + control plane, until told to leave.

``swarm publish`` and ``swarm join`` both end here: :func:`serve` starts a
:class:`swarm.node.Node`, (publishes and) verifies the charter, starts the control plane,
reports readiness, and on SIGTERM/SIGINT leaves gracefully: a coordinator hands off to its
successor before the node drains its running task and stops. SIGTERM is a requested stop
(exit 0, as systemd expects); SIGINT (Ctrl-C) leaves the same way but returns
:data:`INTERRUPTED`, which the commands turn into exit 130 like every other command.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from identity import PeerKey, Signed
from swarm.control import charter
from swarm.control.machine import Timing
from swarm.control.plane import ControlPlane
from swarm.errors import Blocked, ConfigError
from swarm.members import NO_COORDINATE, load_seen_peers, swarm_id
from swarm.node import Node, NodeConfig
from swarm.runtime.chaos import ENV as CHAOS_ENV
from swarm.runtime.chaos import parse as parse_chaos
from swarm.uri import JoinURI

if TYPE_CHECKING:
    from models.catalog import ModelRef

log = logging.getLogger("swarm.member")
CHARTER_WAIT = 15.0
INTERRUPTED = "interrupted"
"""What :func:`serve` returns after a graceful leave started by SIGINT."""


@dataclass
class Publication:
    """What the first node of a new swarm puts in the DHT."""

    swarm_key: PeerKey
    """The swarm's key (signs the charter item)."""
    head: Signed
    """The charter with the owner's proof."""
    history: tuple[bytes, ...] = ()
    """Earlier statements (encoded :class:`identity.Signed`), oldest first."""


@dataclass
class Ready:
    """Handed to the ready callback once the member is up."""

    node: Node
    """The running node."""
    control: ControlPlane
    """Its control plane."""
    uri: JoinURI
    """A join URI naming this node as a bootstrap peer."""
    joined_in: float
    """Seconds from start to joined (charter verified, control plane running)."""
    web: str | None = None
    """The join page's URL when serving browser tabs (``http=``)."""


async def serve(uri: JoinURI, data_dir: Path, *, backend: str = "auto", port: int = 0,
                host: str = "127.0.0.1", threads: int | None = None,
                publication: Publication | None = None, timing: Timing | None = None,
                ready: Callable[[Ready], None] | None = None,
                stop: asyncio.Event | None = None, store_capacity: int = 4 << 30,
                coordinate: bool = True, ice_servers: Sequence[object] = (),
                relay_data: int = 0, http: tuple[str, int] | None = None,
                models: Sequence[ModelRef] = ()) -> str:
    """Be a member until ``stop`` (or SIGTERM/SIGINT) or until kicked/blocked; why we left.

    ``http=(host, port)`` also serves browser tabs (join page, signaling, status panel) and
    the OpenAI-compatible API, whose chat serves ``models`` (default SmolLM2)."""
    started = time.monotonic()
    if uri.salt != charter.CHARTER_SALT:
        raise ConfigError(f"s: this swarm version only knows the salt {charter.CHARTER_SALT!r}")
    sid = swarm_id(uri.pubkey)
    seen = tuple(load_seen_peers(data_dir, sid))  # tried too: they may outlive the URI's

    node = Node(NodeConfig(data_dir=data_dir, swarm_id=sid, validators=charter.validators(), host=host, dht_port=port,
                           bootstrap=tuple(uri.peers), hints=seen, backend=backend, threads=threads,
                           store_capacity=store_capacity,
                           models=tuple(m.address for m in models),
                           model_files=tuple(str(m.path) for m in models), chaos=parse_chaos(os.environ.get(CHAOS_ENV)),
                           roles=("worker",) if coordinate else ("worker", NO_COORDINATE),
                           ice_servers=tuple(ice_servers), relays=3, relay_data=relay_data))
    control = ControlPlane(node, uri.pubkey, data_dir, timing=timing,
                           owner_pin=uri.owner or None)
    stop = stop or asyncio.Event()
    web_server = None
    loop = asyncio.get_running_loop()
    got: list[int] = []

    def on_signal(sig: int) -> None:
        got.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await node.start()
        if publication is not None:
            targets = [await node.dht.put_immutable(h) for h in publication.history]
            await charter.publish(node.dht, publication.swarm_key, publication.head,
                                  tuple(targets))
        control.accept_charter((await _fetch_charter(node, uri, control.charter_floor)).ownership)
        await control.start()
        if control.left.is_set() and control.left_reason == "this peer is blocked":
            # the swarm's current state blocks us (a block saved here is checked against it)
            raise Blocked(f"this peer ({node.peer_id.short()}) is blocked from swarm "
                          f"{uri.name or sid.hex()[:12]}")
        dht_host, dht_port = node.dht.address
        me = uri.with_peers([(dht_host, dht_port)])
        if http is not None:
            from swarm.web.server import start_for_member

            web_server = await start_for_member(node, control, uri, me, http,
                                                openai_api(node, models))
        if ready is not None:
            ready(Ready(node, control, me, time.monotonic() - started,
                        web_server.url if web_server else None))
        left = asyncio.ensure_future(control.left.wait())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([left, stopping], return_when=asyncio.FIRST_COMPLETED)
        for f in (left, stopping):
            f.cancel()
        if control.left.is_set():  # blocked or kicked: our record must not outlive us
            reason = control.left_reason
        else:
            reason = await control.leave()
        await node.withdraw()  # after a handoff: its successor still had us in view
        return INTERRUPTED if got and got[0] == signal.SIGINT else reason
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if web_server is not None:
            await web_server.stop()
        await control.close()
        await node.stop(graceful=True)


async def _fetch_charter(node: Node, uri: JoinURI, floor: int) -> charter.CharterRecord:
    """The verified charter; the DHT may need a moment after the publisher put it."""
    deadline = time.monotonic() + CHARTER_WAIT
    delay = 0.1
    while True:
        try:
            return await charter.fetch(node.dht, uri.pubkey, uri.owner or None, floor=floor)
        except charter.CharterError as exc:
            if "no charter" not in str(exc) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


def openai_api(node: Node, models: Sequence[ModelRef] = ()):
    """All of this member's OpenAI-compatible routes: /v1/embeddings, /v1/chat/completions
    and /v1/models (swarm.web.chat), under the one API key, on one client of its node.
    Chat serves ``models`` (checked files, models.catalog.describe; default SmolLM2) and runs
    their blocks on the swarm's other workers, every value checked (``Client.span_model``),
    and on this member's own forward when it has none."""
    from models.catalog import DEFAULT, KNOWN
    from models.generate import generator
    from swarm.web.chat import ChatAPI, Routes, ServedModel
    from swarm.web.embeddings import api_key

    client = _node_client(node)

    def chat_generator(path: Path | None):
        def made():  # in a thread: the client's calls block, the file is read on first use
            c, gen = client(), generator(path)
            return gen.using(c.span_model(path)) if c.workers() else gen
        return made

    if models:
        served = [ServedModel(r.name, r.ids(), chat_generator(r.path)) for r in models]
    else:  # the default model, named without reading its file here, on the member's loop
        known = KNOWN[DEFAULT]
        served = [ServedModel(known.name, (known.name, *known.aliases), chat_generator(None))]
    return Routes(embeddings_api(node, client),
                  ChatAPI(api_key(Path(node.config.data_dir)), served))


def _node_client(node: Node):
    """A function giving one client of ``node`` (swarm.api.attach), made on first use."""
    made = []
    loop = asyncio.get_running_loop()
    lock = threading.Lock()

    def client():
        with lock:
            if not made:
                from swarm.api import attach

                made.append(attach(node, loop))
            return made[0]

    return client


def embeddings_api(node: Node, client=None):
    """POST /v1/embeddings for this member (swarm.web.embeddings), on a client of its node
    (made on first use; its calls block, so they run in the web server's threads)."""
    from swarm.web.embeddings import EmbeddingsAPI, api_key

    client = client or _node_client(node)

    def embedder():  # in a thread: the client's calls block
        return client().embedder()

    key = api_key(Path(node.config.data_dir))
    log.info("web: POST /v1/embeddings takes the API key in %s",
             Path(node.config.data_dir) / "api-key")
    return EmbeddingsAPI(key, embedder)
