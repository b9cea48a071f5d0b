"""One tab's session with its serving node: signed signaling, validation, membership.

Sans-IO pieces (:func:`seal_json`, :func:`open_json`, :func:`validation_task`,
:func:`check_validation`, :func:`tab_record`) are tested without a browser; the asyncio
adapter :class:`TabSession` drives them over a WebSocket and an aiortc connection.

Signaling messages are JSON bodies signed with Ed25519 in both directions: the node signs
with its peer key, the tab with its own WebCrypto key (its PeerId). Each body carries the
session nonce the node chose, so a body from another session does not verify here.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dht.announce import Announcement, announcement_buffer
from identity.keys import PeerId, PeerKey, verify
from swarm import __version__
from swarm.errors import AuthenticationError, LinkClosed, ProtocolError
from swarm.members import NO_COORDINATE, MemberRecord, membership_topic
from swarm.runtime.protocol import RunTask, TaskArg, TaskFailed, TaskResult

log = logging.getLogger("swarm.web.session")
DOMAIN = b"swarm web signal v1\x00"
MAX_SIGNAL_BODY = 16 * 1024
"""Largest signed signaling body in bytes (an SDP offer is ~1-3 KB)."""
STEP_TIMEOUT = 30.0
"""Seconds the tab may take for one signaling step (its self-test runs before joining)."""
VALIDATE_TIMEOUT = 30.0
"""Seconds the tab has to answer the validation task."""
ANNOUNCE_TTL = 60.0
"""Lifetime of a tab's member record; renewed every third of it while the tab is here."""
MAX_ASKED = 16
"""Data channels one tab may be asked to open at once."""
MAX_TFLOPS = 1000.0
"""Largest TFLOPS claim taken from a tab (its claim only; the scheduler measures)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def seal_json(key: PeerKey, body: dict) -> str:
    """A signed signaling message: ``{"b": body as JSON text, "s": base64 signature}``."""
    text = json.dumps(body, separators=(",", ":"))
    return json.dumps({"b": text, "s": _b64(key.sign(DOMAIN + text.encode()))})


def open_json(raw: str | bytes, signer: PeerId | None, nonce: str) -> tuple[dict, PeerId]:
    """Check a signed message from a tab; returns (body, signer).

    ``signer`` None: the body names its signer in ``peer`` (the first message, "join").
    Raises ProtocolError (malformed) or AuthenticationError (bad signature, other session).
    """
    if not isinstance(raw, str | bytes) or len(raw) > 2 * MAX_SIGNAL_BODY:
        raise ProtocolError(f"a signaling message is text of at most {2 * MAX_SIGNAL_BODY} bytes")
    try:
        outer = json.loads(raw)
        text, sig = outer["b"], base64.b64decode(outer["s"], validate=True)
        body = json.loads(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise ProtocolError(f"malformed signaling message: {exc}") from None
    if not isinstance(text, str) or not isinstance(body, dict) or len(text) > MAX_SIGNAL_BODY:
        raise ProtocolError("a signaling body is a JSON object")
    if signer is None:
        try:
            signer = PeerId(bytes.fromhex(body.get("peer", "")))
        except (ValueError, TypeError):
            raise ProtocolError("join: peer must be 64 hex digits (an Ed25519 key)") from None
    if not verify(signer, sig, DOMAIN + text.encode()):
        raise AuthenticationError(f"signaling message does not verify for {signer.short()}")
    if body.get("nonce") != nonce:
        raise AuthenticationError("signaling message is from another session")
    if not isinstance(body.get("t"), str):
        raise ProtocolError("signaling body has no type")
    return body, signer


@dataclass(frozen=True)
class Join:
    """What a tab says about itself when it joins (its claims, checked where we can)."""

    peer: PeerId
    """The tab's PeerId (its WebCrypto Ed25519 public key)."""
    offer: str
    """Its SDP offer (a data channel labelled "swarm")."""
    tflops: float
    """Its own measured matmul rate (a claim, clamped to MAX_TFLOPS)."""
    backend: str
    """"webgpu" or "cpu"."""


def parse_join(body: dict, peer: PeerId) -> Join:
    if body.get("t") != "join":
        raise ProtocolError(f"expected join, got {str(body.get('t'))[:32]!r}")
    offer, tflops, backend = body.get("offer"), body.get("tflops"), body.get("backend")
    if not isinstance(offer, str) or "m=application" not in offer:
        raise ProtocolError("join: offer must be an SDP with a data channel")
    if type(tflops) not in (int, float) or not math.isfinite(tflops) or tflops < 0:
        raise ProtocolError("join: tflops must be a number >= 0")
    if backend not in ("webgpu", "cpu"):
        raise ProtocolError("join: backend must be webgpu or cpu")
    return Join(peer, offer, min(float(tflops), MAX_TFLOPS), backend)


def validation_task(rng: np.random.Generator, task: int = 1) -> tuple[RunTask, np.ndarray]:
    """A matmul whose exact product we know: small integers, exact in float32.

    Fresh random inputs every time, so a tab cannot answer from a table; shapes not
    multiples of the kernel's tiles, so padding and edges are exercised."""
    a = rng.integers(-8, 9, size=(37, 29)).astype(np.float32)
    b = rng.integers(-8, 9, size=(29, 23)).astype(np.float32)
    msg = RunTask(task, "matmul", 0, -1, "matmul", [TaskArg(array=a), TaskArg(array=b)])
    return msg, a @ b


def check_validation(reply: object, want: np.ndarray, task: int = 1) -> None:
    """Raise AuthenticationError unless ``reply`` is the exact product (not zeros, not NaN)."""
    if isinstance(reply, TaskFailed):
        raise AuthenticationError(f"validation task failed on the tab: {reply.message[:200]}")
    if not isinstance(reply, TaskResult) or reply.task != task or len(reply.outputs) != 1:
        raise AuthenticationError("the tab did not answer the validation task")
    out = np.asarray(reply.outputs[0], dtype=np.float32)
    if out.shape != want.shape:
        raise AuthenticationError(f"validation product has shape {out.shape}, "
                                  f"expected {want.shape}")
    if not np.all(np.isfinite(out)):
        raise AuthenticationError("validation product holds NaN or infinity")
    if not np.any(out):
        raise AuthenticationError("validation product is all zeros (broken GPU)")
    if not np.array_equal(out, want):
        bad = int(np.count_nonzero(out != want))
        raise AuthenticationError(f"validation product is wrong in {bad} of {out.size} cells")


def tab_record(tab: PeerId, via: PeerId, relay: tuple[str, int], tflops: float,
               tasks: int = 0) -> MemberRecord:
    """The member record a tab signs: a worker that never coordinates, reached via us."""
    return MemberRecord(tab, tflops, (relay,), None, __version__, ("worker", NO_COORDINATE),
                        tasks=tasks, kind="browser", via=via)


@dataclass
class TabStats:
    """What one tab did, as seen by its serving node (for the status panel)."""

    shards: int = 0
    """Task results relayed from the tab."""
    flop: float = 0.0
    """Floating-point operations of those results (2 m k n each)."""
    running: int = 0
    """Tasks sent to it and not answered yet."""


class TabSession:
    """Drives one tab from WebSocket hello to leaving (see module docstring)."""

    def __init__(self, key: PeerKey, swarm_id: bytes, relay_addr: tuple[str, int],
                 publish: Callable[[bytes, Announcement], object]) -> None:
        self.key = key
        self.swarm_id = swarm_id
        self.relay_addr = relay_addr
        self._publish = publish
        self.nonce = secrets.token_hex(16)
        self.join: Join | None = None
        self.pc = None
        self.link = None
        self.stats = TabStats()
        self.validate_seconds: float | None = None
        self._inbox: asyncio.Queue[dict] = asyncio.Queue(maxsize=8)
        self.gone = asyncio.Event()
        self.send: Callable[[str], object] | None = None
        """Sends a signed message to the tab (set once the WebSocket is up)."""
        self.asked: dict[str, asyncio.Future] = {}
        """Data channels asked of the tab, by label, until they open."""
        self._labels = itertools.count(1)

    async def open_channel(self, purpose: str, timeout: float):
        """Ask the tab to open one more data channel (Chrome ignores channels aiortc opens
        on an established connection, so the tab opens them); the channel once open."""
        if self.send is None or len(self.asked) >= MAX_ASKED:
            raise ProtocolError("the tab cannot open another channel now")
        label = f"{purpose}:{next(self._labels)}"
        fut = self.asked[label] = asyncio.get_running_loop().create_future()
        try:
            await self.send(self.send_body({"t": "open", "label": label}))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.asked.pop(label, None)

    @property
    def peer(self) -> PeerId | None:
        return self.join.peer if self.join else None

    def hello(self) -> str:
        return seal_json(self.key, {"t": "hello", "nonce": self.nonce,
                                    "server": self.key.peer_id.hex(),
                                    "swarm": self.swarm_id.hex()})

    def send_body(self, body: dict) -> str:
        return seal_json(self.key, dict(body, nonce=self.nonce))

    def receive(self, raw: str) -> None:
        """A message from the tab after join (signed by it); queued for the session."""
        body, _ = open_json(raw, self.peer, self.nonce)
        try:
            self._inbox.put_nowait(body)
        except asyncio.QueueFull:
            raise ProtocolError("the tab sends faster than the session reads") from None

    async def expect(self, kind: str, timeout: float = STEP_TIMEOUT) -> dict:
        body = await asyncio.wait_for(self._inbox.get(), timeout)
        if body["t"] != kind:
            raise ProtocolError(f"expected {kind}, got {str(body['t'])[:32]!r}")
        return body

    async def announce(self, send: Callable[[str], object]) -> None:
        """Have the tab sign its member record, check it, and publish it in the DHT."""
        assert self.join is not None
        topic = membership_topic(self.swarm_id)
        record = tab_record(self.join.peer, self.key.peer_id, self.relay_addr,
                            self.join.tflops, self.stats.running).encode()
        expires = time.time() + ANNOUNCE_TTL
        buf = announcement_buffer(topic, expires, record)
        await send(self.send_body({"t": "sign", "buf": _b64(buf)}))
        body = await self.expect("signed")
        try:
            sig = base64.b64decode(body.get("sig", ""), validate=True)
        except (ValueError, TypeError):
            raise ProtocolError("signed: sig must be base64") from None
        ann = Announcement(self.join.peer, record, expires, sig)
        try:
            ann.check(topic)
        except Exception as exc:
            raise AuthenticationError(f"the tab's member record signature: {exc}") from None
        result = self._publish(topic, ann)
        if asyncio.iscoroutine(result):
            await result

    async def validate(self, link, rng: np.random.Generator | None = None) -> None:
        """Run a fresh known product on the tab; AuthenticationError unless exact."""
        msg, want = validation_task(rng or np.random.default_rng())
        started = time.perf_counter()
        await link.send(msg)
        try:
            reply = await asyncio.wait_for(link.recv(), VALIDATE_TIMEOUT)
        except (TimeoutError, LinkClosed) as exc:
            raise AuthenticationError(f"no answer to the validation task: {exc!r}") from None
        check_validation(reply, want)
        self.validate_seconds = time.perf_counter() - started
