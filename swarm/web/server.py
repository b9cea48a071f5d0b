"""The node's web side: join page, tab signaling (WebSocket), relay listener, status JSON.

Everything is served by the node itself: static ES modules from ``static/``, the tiled WGSL
kernel from ``compute/kernels`` (the same file native workers compile), and JSON views. The
WebSocket refuses cross-origin pages (a site elsewhere cannot enrol its visitors here) and
caps message size, sessions and step times; a tab is announced only after it answered a
fresh known matmul exactly over its data channel.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import WSMsgType, web
from aiortc import RTCPeerConnection, RTCSessionDescription

import compute
from identity.keys import PeerId
from swarm.errors import AuthenticationError, LinkClosed, ProtocolError
from swarm.links import tls
from swarm.links.base import PeerLink
from swarm.links.tabs import OPEN_TIMEOUT, RelayOpen, RelayOpened, channel_link, pipe
from swarm.loop import Supervisor
from swarm.runtime.protocol import PutObject, RunTask, TaskFailed, TaskResult
from swarm.web import guard
from swarm.web.hosts import allowed_names, host_guard
from swarm.web.session import ANNOUNCE_TTL, STEP_TIMEOUT, TabSession, parse_join

log = logging.getLogger("swarm.web")
STATIC = Path(__file__).parent / "static"
KERNEL = Path(compute.__file__).parent / "kernels" / "matmul_tiled.wgsl"
MAX_TABS = 64
"""Tabs one node serves at once (each holds a WebRTC connection and a DHT record)."""
MAX_WS_MESSAGE = 32 * 1024
HISTORY = 120
"""Samples of per-peer throughput kept for the status panel (one a second)."""
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css",
          ".wgsl": "text/plain"}


@dataclass(frozen=True)
class SwarmInfo:
    """What the join page says about the swarm."""

    swarm_id: bytes
    name: str
    owner: str
    """Owner key fingerprint (hex)."""
    hardware_backed: bool
    uri: str


class WebServer:
    """Serves tabs for one running member (``member.serve`` starts and stops it)."""

    def __init__(self, node, info: SwarmInfo, host: str, port: int,
                 observe=None, *, allowed_hosts: tuple[str, ...] = (), api=None) -> None:
        self.node = node
        self.allowed_hosts = allowed_hosts
        """Host names to answer besides addresses, localhost and ``host`` (swarm.web.hosts)."""
        self.api = api
        """An :class:`swarm.web.embeddings.EmbeddingsAPI` to serve at /v1, or None."""
        self.info = info
        self.host, self.port = host, port
        self._observe = observe
        self.tabs: dict[PeerId, TabSession] = {}
        self.relay: tls.TLSServer | None = None
        self._runner: web.AppRunner | None = None
        self._tasks = Supervisor(log, "web task")
        self.history: collections.deque = collections.deque(maxlen=HISTORY)
        self._status_cache: tuple[float, dict] | None = None
        self._sockets = 0
        self.guard = guard.Guard(guard.limits())
        """Open HTTP connections, capped (swarm.web.guard)."""
        self._listener: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    async def start(self) -> None:
        self.relay = await tls.listen(self.node.key, self.node.config.host, 0,
                                      on_link=self._relay, accept=self.node._accepts)
        app = web.Application(client_max_size=64 * 1024, middlewares=[
            guard.headers_in, host_guard(allowed_names(self.host, self.allowed_hosts))])
        app.router.add_get("/", self._page("join.html"))
        app.router.add_get("/status", self._page("status.html"))
        app.router.add_get("/config.json", self._config)
        app.router.add_get("/status.json", self._status)
        app.router.add_get("/ws", self._ws)
        app.router.add_get("/kernel/matmul_tiled.wgsl", self._kernel)
        app.router.add_get("/static/{name}", self._static)
        if self.api is not None:
            self.api.add_routes(app)
        self._runner = web.AppRunner(app, access_log=None,
                                     keepalive_timeout=self.guard.limits.idle_timeout)
        await self._runner.setup()
        # slow-loris: connections capped per address and in all, late headers closed
        self._listener = await guard.serve(self._runner, self.host, self.port, self.guard)
        self.port = self._listener.sockets[0].getsockname()[1]
        self._spawn(self._sample())
        log.info("web: %s (relay %s:%d)", self.url, self.node.config.host, self.relay.port)

    async def stop(self) -> None:
        self._tasks.cancel()
        for tab in list(self.tabs.values()):
            tab.gone.set()
            if tab.pc is not None:
                await tab.pc.close()
        if self.relay is not None:
            await self.relay.close()
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def _spawn(self, coro) -> asyncio.Task:
        return self._tasks.spawn(coro)

    # -- pages ------------------------------------------------------------------------

    def _page(self, name: str):
        async def handler(request: web.Request) -> web.Response:
            return self._file(STATIC / name)
        return handler

    @staticmethod
    def _file(path: Path) -> web.Response:
        return web.Response(body=path.read_bytes(), content_type=_TYPES[path.suffix],
                            headers={"Cache-Control": "no-cache",
                                     "Content-Security-Policy":
                                         "default-src 'self'; connect-src 'self'; "
                                         "img-src 'self' data:"})

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        path = STATIC / name
        if "/" in name or name.startswith(".") or path.suffix not in _TYPES \
                or not path.is_file():
            raise web.HTTPNotFound()
        return self._file(path)

    async def _kernel(self, request: web.Request) -> web.Response:
        return self._file(KERNEL)

    async def _config(self, request: web.Request) -> web.Response:
        i = self.info
        return web.json_response({
            "swarm": i.swarm_id.hex(), "name": i.name, "owner": i.owner,
            "hardware_backed": i.hardware_backed, "server": self.node.peer_id.hex(),
            "server_id": str(self.node.peer_id), "uri": i.uri,
            "runs": "matmul shards of jobs submitted to this swarm, on this tab's GPU "
                    "(WebGPU, the swarm's tiled WGSL kernel) or CPU; nothing else: no code "
                    "is sent to the tab, only matrices"})

    async def _status(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        if self._status_cache is None or now - self._status_cache[0] > 1.0:
            data = await self._observe() if self._observe is not None else {}
            me, here = str(self.node.peer_id), {str(p) for p in self.tabs}
            # tabs that left us are listed in the DHT until their record expires: not here
            members = [m for m in data.get("members", [])
                       if m.get("via") != me or m["peer_id"] in here]
            host = self.node.host
            data = dict(data, members=members, served_by=me,
                        tabs=[str(p) for p in self.tabs],
                        throughput=list(self.history),
                        training=host.training.series() if host is not None else [])
            self._status_cache = (now, data)
        return web.json_response(self._status_cache[1])

    async def _sample(self) -> None:
        """Once a second: shards/s and GFLOP/s per peer this node sees (itself, its tabs)."""
        last: dict[str, tuple[int, float]] = {}
        while True:
            await asyncio.sleep(1.0)
            counts: dict[str, tuple[int, float]] = {}
            if self.node.host is not None:
                counts[str(self.node.peer_id)] = (self.node.host.stats.tasks, 0.0)
            for peer, tab in self.tabs.items():
                counts[str(peer)] = (tab.stats.shards, tab.stats.flop)
            sample = {}
            for peer, (n, flop) in counts.items():
                n0, f0 = last.get(peer, (n, flop))
                sample[peer] = {"shards": n - n0, "gflops": round((flop - f0) / 1e9, 4)}
            last = counts
            self.history.append({"t": round(time.time(), 1), "peers": sample})

    # -- tab signaling ------------------------------------------------------------------

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != request.host:
            raise web.HTTPForbidden(text="cross-origin tabs cannot join through this node")
        ws = web.WebSocketResponse(max_msg_size=MAX_WS_MESSAGE, heartbeat=20.0)
        await ws.prepare(request)
        if self._sockets >= MAX_TABS:  # joined or joining: each holds a socket (and a pc)
            await ws.close(message=b"this node serves as many tabs as it can")
            return ws
        self._sockets += 1
        session = TabSession(self.node.key, self.info.swarm_id,
                             (self.node.config.host, self.relay.port),
                             self.node.dht.publish_announcement)
        try:
            await self._run_tab(ws, session)
        except Exception as exc:
            known = isinstance(exc, ProtocolError | AuthenticationError | TimeoutError
                               | LinkClosed | ConnectionError)
            who = session.peer.short() if session.peer else "?"
            if known:
                log.warning("tab %s refused: %s", who, exc)
            else:
                log.exception("tab %s: internal error", who)
            if not ws.closed:
                reason = str(exc)[:300] if known else "internal error on the node"
                await ws.send_str(session.send_body({"t": "refused", "reason": reason}))
        finally:
            self._sockets -= 1
            session.gone.set()
            if session.peer is not None and self.tabs.get(session.peer) is session:
                del self.tabs[session.peer]
            if session.pc is not None:
                await session.pc.close()
            await ws.close()
        return ws

    async def _run_tab(self, ws: web.WebSocketResponse, session: TabSession) -> None:
        from swarm.web.session import open_json

        await ws.send_str(session.hello())
        msg = await asyncio.wait_for(ws.receive(), STEP_TIMEOUT)
        if msg.type != WSMsgType.TEXT:
            raise ConnectionError("the tab left before joining")
        body, peer = open_json(msg.data, None, session.nonce)
        session.join = join = parse_join(body, peer)
        if not self.node._accepts(peer):
            raise AuthenticationError("this tab's peer is blocked in this swarm")
        old = self.tabs.get(peer)
        if old is not None:  # the same browser profile again (a reload): the newest wins
            old.gone.set()
        self.tabs[peer] = session
        reader = self._spawn(self._read_ws(ws, session))
        session.send = ws.send_str
        pc = session.pc = RTCPeerConnection()
        opened: asyncio.Future = asyncio.get_running_loop().create_future()

        @pc.on("datachannel")
        def _on_channel(channel) -> None:
            fut = opened if not opened.done() else session.asked.pop(channel.label, None)
            if fut is None:  # a channel we did not ask for
                channel.close()
            elif channel.readyState == "open":
                fut.done() or fut.set_result(channel)
            else:
                channel.on("open", lambda: fut.done() or fut.set_result(channel))

        @pc.on("connectionstatechange")
        def _on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                session.gone.set()
                if not opened.done():
                    opened.set_exception(ConnectionError(f"WebRTC {pc.connectionState}"))

        await pc.setRemoteDescription(RTCSessionDescription(join.offer, "offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        await ws.send_str(session.send_body({"t": "answer", "sdp": pc.localDescription.sdp}))
        channel = await asyncio.wait_for(opened, STEP_TIMEOUT)
        link = session.link = channel_link(self.node.peer_id, peer, pc, channel)
        link.add_close_callback(lambda _: session.gone.set())
        await session.validate(link)
        await session.announce(ws.send_str)
        await ws.send_str(session.send_body({"t": "joined", "peer": str(peer),
                                             "check_seconds": session.validate_seconds}))
        log.info("tab %s joined (%s, %.4f TFLOPS claimed)", peer.short(), join.backend,
                 join.tflops)
        while not session.gone.is_set() and not reader.done():
            try:
                await asyncio.wait_for(session.gone.wait(), ANNOUNCE_TTL / 3)
            except TimeoutError:
                if not self.node._accepts(peer):
                    raise AuthenticationError("this tab's peer is now blocked here") from None
                await session.announce(ws.send_str)
        reader.cancel()
        await link.close("tab left")

    @staticmethod
    async def _read_ws(ws: web.WebSocketResponse, session: TabSession) -> None:
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    break
                session.receive(msg.data)
        except (ProtocolError, AuthenticationError) as exc:
            log.warning("tab %s: %s", session.peer.short() if session.peer else "?", exc)
        finally:
            session.gone.set()

    # -- relay --------------------------------------------------------------------------

    async def _relay(self, link: PeerLink) -> None:
        """A requester asks for one of our tabs: open a channel to it and pipe."""
        try:
            first = await asyncio.wait_for(link.recv(), OPEN_TIMEOUT)
        except (TimeoutError, LinkClosed):
            await link.close("expected web.open")
            return
        tab = self.tabs.get(first.target) if isinstance(first, RelayOpen) else None
        if tab is None or tab.link is None or tab.gone.is_set():
            await link.send(RelayOpened(False, "no such tab here (it left?)"))
            await link.close("no such tab")
            return
        try:
            channel = await tab.open_channel(f"rq:{link.remote.hex()}", OPEN_TIMEOUT)
        except (TimeoutError, ProtocolError, ConnectionError):
            await link.send(RelayOpened(False, "the tab did not open a channel"))
            await link.close("tab unreachable")
            return
        to_tab = channel_link(self.node.peer_id, tab.peer, tab.pc, channel)
        await link.send(RelayOpened(True))
        shapes: dict[bytes, tuple[int, ...]] = {}
        pending: dict[int, int] = {}

        def count(src: PeerLink, msg) -> None:
            stats = tab.stats
            if src is link and isinstance(msg, PutObject):
                if len(shapes) < 256:
                    shapes[msg.oid] = msg.array.shape
            elif src is link and isinstance(msg, RunTask) and len(pending) < 4096:
                dims = [a.array.shape if a.array is not None else shapes.get(a.oid)
                        for a in msg.args]
                k = dims[0][1] if len(dims) == 2 and dims[0] and len(dims[0]) == 2 else 0
                pending[msg.task] = k
                stats.running += 1
            elif src is to_tab and isinstance(msg, TaskResult | TaskFailed):
                k = pending.pop(msg.task, None)
                if k is not None:
                    stats.running -= 1
                if isinstance(msg, TaskResult):
                    stats.shards += 1
                    out = msg.outputs[0] if msg.outputs else None
                    if k and out is not None and out.ndim == 2:
                        stats.flop += 2.0 * out.shape[0] * out.shape[1] * k

        closer = self._spawn(self._close_when_gone(tab, link))
        try:
            await pipe(link, to_tab, count)
        finally:
            closer.cancel()

    @staticmethod
    async def _close_when_gone(tab: TabSession, link: PeerLink) -> None:
        await tab.gone.wait()
        await link.close("the tab left")


async def start_for_member(node, control, uri, me, http: tuple[str, int],
                           api=None) -> WebServer:
    """Start serving tabs next to a running member (its charter already verified); ``api``
    (a :class:`swarm.web.embeddings.EmbeddingsAPI`) is served at /v1 when given."""
    from swarm.control import observer
    from swarm.members import swarm_id

    own = control.ownership

    async def observe() -> dict:
        return (await observer.observe(node.dht, uri)).to_json()

    info = SwarmInfo(swarm_id(uri.pubkey), own.name, own.owner.fingerprint().hex(),
                     own.owner.hardware_backed, str(me))
    server = WebServer(node, info, http[0], http[1], observe, api=api)
    await server.start()
    return server


def parse_http(text: str) -> tuple[str, int]:
    """``--http HOST:PORT`` (port 0: any free one); a ConfigError says what is wrong."""
    from swarm.errors import ConfigError

    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--http {text[:60]!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]"), int(port)


def print_join_link(url: str, out) -> None:
    """The join link and its QR code (segno), for a phone's camera."""
    import segno

    print(f"join from a browser: {url}", file=out, flush=True)
    segno.make(url, error="l").terminal(out=out, compact=True, border=1)
    print(f"status panel: {url}status", file=out, flush=True)
