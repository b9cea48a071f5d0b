"""The PeerLink interface and the machinery every link kind shares.

A link moves :mod:`swarm.wire` messages between two authenticated peers. Each kind (TLS,
WebRTC, in-memory) only knows how to read and write *frames*; :class:`FramedLink` does the
rest the same way for all of them: encoding, decoding, keepalive pings with RTT, a bounded
receive queue (a full queue stops the reader, so a slow receiver slows its sender through
the transport's own flow control), a clean goodbye, and closing on any protocol error.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import itertools
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from identity.keys import PeerId
from swarm import wire
from swarm.errors import LinkClosed, ProtocolError
from swarm.links import shm

log = logging.getLogger(__name__)

PROBE_GRACE = 0.1
"""Seconds a timed-out probe lets the read loop take frames already waiting on our side."""


@wire.message("link.ping")
class Ping(wire.Message):
    """Keepalive and RTT probe; the other link answers with :class:`Pong` itself."""

    seq: int
    """Echoed in the Pong, to match it with the send time."""


@wire.message("link.pong")
class Pong(wire.Message):
    """Answer to a :class:`Ping`."""

    seq: int
    """The Ping's seq."""


@wire.message("link.goodbye")
class Goodbye(wire.Message):
    """Sent before a deliberate close, so the other side knows why."""

    reason: str
    """Why the link is closed, in words (e.g. "protocol error: ...", "shutting down")."""


@dataclass(frozen=True)
class LinkOptions:
    """Tunables shared by every link kind."""

    keepalive_interval: float = 5.0
    """Seconds between keepalive pings."""
    keepalive_timeout: float = 20.0
    """Close the link when nothing at all arrived for this long."""
    probe_timeout: float = 5.0
    """A :meth:`PeerLink.probe` closes the link when nothing at all arrives for this long."""
    frame_timeout: float = 10.0
    """A frame whose first bytes arrived must be complete within this (stream links)."""
    recv_queue: int = 64
    """Decoded messages held for :meth:`PeerLink.recv`; when full, reading stops."""
    window: int = 16 << 20
    """Bytes of decoded messages held for :meth:`PeerLink.recv` before reading stops (at
    least one message), and bytes a sender may have in flight unconsumed on links whose
    transport has no receive-side backpressure (WebRTC data channels: a peer that sends
    more than it was granted is closed)."""
    limits: wire.Limits = field(default_factory=wire.Limits)
    """What the decoder accepts from the peer."""


@dataclass(frozen=True)
class LinkStats:
    """A snapshot of one link's health, for status output and peer choice."""

    kind: str
    """"tls", "webrtc" or "memory"."""
    remote: PeerId
    """The authenticated peer at the other end."""
    rtt_ms: float | None
    """Median of recent keepalive round trips, None before the first pong."""
    bytes_sent: int
    """Frame bytes written (without transport framing)."""
    bytes_received: int
    """Frame bytes read."""
    messages_sent: int
    """Messages sent, keepalives included."""
    messages_received: int
    """Messages received, keepalives included."""
    keepalives_lost: int
    """Pings that got no pong before the next ping was due."""
    closed: bool
    """Whether the link is closed."""
    close_reason: str | None
    """Why it closed, if it did."""


class _Channel:
    """A bounded FIFO between tasks whose close wakes everybody with a LinkClosed.

    Bounded in items and, where ``max_bytes`` is given, in the bytes of the items it holds
    (each :meth:`put` says how many; one item is always taken, however large)."""

    def __init__(self, maxsize: int, max_bytes: int | None = None) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._sizes: collections.deque[int] = collections.deque()
        self._maxsize = maxsize
        self._max_bytes = max_bytes
        self.nbytes = 0
        """Bytes of the items held (as their producers counted them)."""
        self._getters: list[asyncio.Future[None]] = []
        self._putters: list[asyncio.Future[None]] = []
        self._closed: LinkClosed | None = None
        self.closed_event = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    @staticmethod
    def _wake(waiters: list[asyncio.Future[None]]) -> None:
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        waiters.clear()

    async def _wait(self, waiters: list[asyncio.Future[None]]) -> None:
        fut = asyncio.get_running_loop().create_future()
        waiters.append(fut)
        await fut

    def full(self) -> bool:
        return len(self._items) >= self._maxsize or (
            self._max_bytes is not None and bool(self._items) and self.nbytes >= self._max_bytes)

    async def put(self, item: Any, nbytes: int = 0) -> None:
        while self.full() and self._closed is None:
            await self._wait(self._putters)
        if self._closed is not None:
            raise self._closed.again()
        self._append(item, nbytes)

    def put_nowait(self, item: Any, nbytes: int = 0) -> None:
        """Append ignoring the bound (for producers bounded otherwise, e.g. by credit)."""
        if self._closed is None:
            self._append(item, nbytes)

    def _append(self, item: Any, nbytes: int) -> None:
        self._items.append(item)
        self._sizes.append(nbytes)
        self.nbytes += nbytes
        self._wake(self._getters)

    async def get(self) -> Any:
        """The next item; after close, the items left and then LinkClosed."""
        while not self._items:
            if self._closed is not None:
                raise self._closed.again()
            await self._wait(self._getters)
        item = self._items.popleft()
        self.nbytes -= self._sizes.popleft()
        self._wake(self._putters)
        return item

    def drop(self, exc: LinkClosed) -> None:
        """Close and forget what is held (a peer that overran its grant gets nothing read)."""
        self._items.clear()
        self._sizes.clear()
        self.nbytes = 0
        self.close(exc)

    def close(self, exc: LinkClosed) -> None:
        if self._closed is None:
            self._closed = exc
        self.closed_event.set()
        self._wake(self._getters)
        self._wake(self._putters)


class PeerLink(abc.ABC):
    """An authenticated, ordered, reliable message link to one peer."""

    kind: str
    """"tls", "webrtc" or "memory"."""
    local: PeerId
    """Our own PeerId."""
    remote: PeerId
    """The peer's PeerId, proven by the link's handshake (certificate or signed SDP)."""
    shm: shm.Channel | None = None
    """Shared memory with a peer on this host, once negotiated (see swarm.links.shm)."""
    tab: bool = False
    """The peer is a browser tab: it runs only the matmul actor (swarm/web/static/host.js)."""

    @abc.abstractmethod
    async def send(self, msg: wire.Message) -> None:
        """Send one message; waits while the transport's buffers are full."""

    @abc.abstractmethod
    async def recv(self) -> wire.Message:
        """The next message; raises :class:`~swarm.errors.LinkClosed` once closed."""

    @abc.abstractmethod
    async def close(self, reason: str = "closed") -> None:
        """Say goodbye and close; idempotent."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """Whether the link is closed."""

    @abc.abstractmethod
    def stats(self) -> LinkStats:
        """Counters and health figures."""

    @abc.abstractmethod
    async def ping(self, timeout: float = 5.0) -> float:
        """Round-trip time of one ping in seconds (raises TimeoutError)."""

    @abc.abstractmethod
    async def probe(self) -> bool:
        """Whether the peer is still there, asked because a task there is overdue: True when
        anything arrives within ``probe_timeout``; otherwise the link is closed as silent
        and False. A relayed path whose NAT mapping vanished does not break, it goes quiet,
        and the keepalive alone would take ``keepalive_timeout`` to say so."""

    @abc.abstractmethod
    async def wait_closed(self) -> LinkClosed:
        """Wait until the link is closed; returns the LinkClosed that says why."""

    def __aiter__(self) -> PeerLink:
        return self

    async def __anext__(self) -> wire.Message:
        try:
            return await self.recv()
        except LinkClosed:
            raise StopAsyncIteration from None


class FramedLink(PeerLink):
    """A PeerLink over any transport that can read and write frames.

    Subclasses implement :meth:`_read_frame`, :meth:`_write_frames` and
    :meth:`_close_transport`, then call :meth:`_start`.
    """

    def __init__(self, local: PeerId, remote: PeerId, options: LinkOptions | None = None) -> None:
        self.local = local
        self.remote = remote
        self.options = options or LinkOptions()
        self._decoder = wire.Decoder(self.options.limits)
        self._queue = _Channel(self.options.recv_queue, self.options.window)
        self._queued_mark = 0  # bytes received (shared memory too) at the last one queued
        self._send_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._ping_seq = itertools.count(1)
        self._pings: dict[int, tuple[float, asyncio.Future[float] | None]] = {}
        self._rtts: collections.deque[float] = collections.deque(maxlen=16)
        self._pong_pending = False
        self._ping_pending = False
        self._stalled = False
        self._closing_locally = False
        self._closed: LinkClosed | None = None
        self._closed_event = asyncio.Event()
        self._close_callbacks: list[Callable[[PeerLink], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._last_rx = self._last_progress = time.monotonic()
        self._bytes_sent = self._bytes_received = 0
        self._msgs_sent = self._msgs_received = 0
        self._lost = 0
        self._shm_offer: shm.Offer | None = None
        self._shm_done_pending = False
        self._probe: asyncio.Task[bool] | None = None

    # -- transport hooks -----------------------------------------------------------------

    @abc.abstractmethod
    async def _read_frame(self) -> bytes | bytearray:
        """The next frame; raises ProtocolError for bad framing, anything else for EOF."""

    @abc.abstractmethod
    async def _write_frames(self, frames: list[wire.Frame]) -> None:
        """Write frames in order and wait until the transport can take more."""

    @abc.abstractmethod
    async def _close_transport(self) -> None:
        """Close the underlying transport (called once)."""

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read_loop(), name=f"link-read-{self.remote.short()}"),
                       loop.create_task(self._keepalive_loop(),
                                        name=f"link-keepalive-{self.remote.short()}")]

    # -- public API ----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed is not None

    @property
    def close_reason(self) -> str | None:
        return self._closed.reason if self._closed else None

    @property
    def error(self) -> BaseException | None:
        """The exception that closed the link (a ProtocolError counts against the peer)."""
        return self._closed.error if self._closed else None

    def add_close_callback(self, callback: Callable[[PeerLink], None]) -> None:
        """Call ``callback(link)`` once the link closes (at once if it already has)."""
        if self._closed is not None:
            callback(self)
        else:
            self._close_callbacks.append(callback)

    async def send(self, msg: wire.Message) -> None:
        if self._closed is not None:
            raise self._closed.again()
        frames = wire.encode(msg, next(self._ids) & 0xFFFFFFFF,
                             spill=self.shm.spill if self.shm is not None else None)
        await self._send_frames(frames)

    async def _send_frames(self, frames: list[wire.Frame]) -> None:
        async with self._send_lock:
            if self._closed is not None:
                raise self._closed.again()
            try:
                await self._write_frames(frames)
            except LinkClosed:
                raise
            except (ConnectionError, OSError) as exc:
                self._abort(f"connection lost while sending: {exc}")
                raise self._closed.again() from exc  # type: ignore[union-attr]
        self._msgs_sent += 1
        self._bytes_sent += sum(map(len, frames))

    async def recv(self) -> wire.Message:
        return await self._queue.get()

    def use_shm(self, channel: shm.Channel) -> None:
        """Send and receive large arrays through shared memory from now on."""
        self.shm = channel
        self._decoder.resolve = channel.resolve

    async def ping(self, timeout: float = 5.0) -> float:
        if self._closed is not None:
            raise self._closed.again()
        seq = next(self._ping_seq)
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._pings[seq] = (time.perf_counter(), fut)
        try:
            await self.send(Ping(seq))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._pings.pop(seq, None)

    async def probe(self) -> bool:
        if self._closed is not None:
            return False
        if self._probe is None:  # one probe at a time: every overdue task asks this one
            self._probe = asyncio.get_running_loop().create_task(self._probe_once())
        return await asyncio.shield(self._probe)

    async def _probe_once(self) -> bool:
        asked, timeout = time.monotonic(), self.options.probe_timeout
        try:
            await self.ping(timeout)
            return True
        except LinkClosed:
            return False
        except TimeoutError:
            # Frames already in our socket buffer count: let the read loop take them first
            # (our own loop may have been the slow one).
            await asyncio.sleep(PROBE_GRACE)
            if self._closed is not None:
                return False
            if self._last_rx > asked or self._stalled:
                return True
            self._abort(f"silent: nothing heard for {time.monotonic() - asked:.1f} s after "
                        f"a probe")
            return False
        finally:
            self._probe = None

    async def wait_closed(self) -> LinkClosed:
        await self._closed_event.wait()
        assert self._closed is not None
        return self._closed

    async def close(self, reason: str = "closed") -> None:
        if self._closed is not None or self._closing_locally:
            await self._closed_event.wait()
            return
        self._closing_locally = True
        await self._goodbye(reason)
        self._mark_closed(LinkClosed(f"closed locally: {reason}"))
        await self._shutdown()

    def stats(self) -> LinkStats:
        return LinkStats(
            kind=self.kind, remote=self.remote,
            rtt_ms=statistics.median(self._rtts) * 1e3 if self._rtts else None,
            bytes_sent=self._bytes_sent, bytes_received=self._bytes_received,
            messages_sent=self._msgs_sent, messages_received=self._msgs_received,
            keepalives_lost=self._lost, closed=self.closed, close_reason=self.close_reason)

    def __repr__(self) -> str:
        state = f"closed: {self.close_reason}" if self._closed else "open"
        return f"<{type(self).__name__} {self.local.short()}->{self.remote.short()} {state}>"

    # -- internals -----------------------------------------------------------------------

    async def _goodbye(self, reason: str) -> None:
        """Best effort: tell the peer why, without waiting long on a stuck transport."""
        try:
            frames = wire.encode(Goodbye(reason[:200]), next(self._ids) & 0xFFFFFFFF)
            await asyncio.wait_for(self._send_frames(frames), 1.0)
        except Exception:  # the peer may be gone already, or the transport stuck
            pass

    def _mark_closed(self, exc: LinkClosed) -> None:
        if self._closed is not None:
            return
        self._closed = exc
        level = logging.WARNING if exc.error is not None else logging.DEBUG
        log.log(level, "link %s %s: %s", self.kind, self.remote.short(), exc.reason)
        self._queue.close(exc)
        for _, fut in self._pings.values():
            if fut is not None and not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved: a ping still sending fails on its send instead
        self._closed_event.set()
        if self.shm is not None:
            self.shm.close()
        if self._shm_offer is not None:
            os.close(self._shm_offer.fd)
            self._shm_offer = None
        for cb in self._close_callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("link close callback failed")
        self._close_callbacks.clear()

    def _abort(self, reason: str, error: BaseException | None = None) -> None:
        """Close because of a failure seen inside the link (no goodbye)."""
        if self._closed is None:
            self._mark_closed(LinkClosed(reason, error))
            self._tasks.append(asyncio.get_running_loop().create_task(self._shutdown()))

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        try:
            await self._close_transport()
        except Exception as exc:  # closing a broken transport may fail; it is gone anyway
            log.debug("closing %s transport: %s", self.kind, exc)

    async def _read_loop(self) -> None:
        try:
            while True:
                frame = await self._read_frame()
                self._last_rx = time.monotonic()
                self._bytes_received += len(frame)
                pending = self._decoder.pending_messages
                msgs = self._decoder.feed(frame)
                if frame[1] == wire.KIND_CHUNK or self._decoder.pending_messages > pending:
                    self._last_progress = self._last_rx  # a message being reassembled moved
                if self.shm is not None and self.shm.mapped:
                    self._release_shm([])
                for msg in msgs:
                    self._msgs_received += 1
                    if not await self._dispatch(msg):
                        return
                msgs = msg = None  # type: ignore[assignment]  # hold no array while idle
        except ProtocolError as exc:
            await self._goodbye(f"protocol error: {exc}")
            self._abort(f"protocol error from peer: {exc}", exc)
        except LinkClosed as exc:
            self._abort(exc.reason, exc.error)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # EOF, reset, TLS alerts: the peer is gone
            self._abort(f"connection lost: {type(exc).__name__}: {exc}")

    async def _dispatch(self, msg: wire.Message) -> bool:
        """Handle link-level messages; queue the rest. False when the link ends."""
        if isinstance(msg, Ping):
            if not self._pong_pending:  # at most one pong in flight: pings cannot pile up
                self._pong_pending = True
                self._tasks.append(asyncio.get_running_loop().create_task(self._pong(msg.seq)))
        elif isinstance(msg, Pong):
            sent = self._pings.pop(msg.seq, None)
            if sent is not None:
                rtt = time.perf_counter() - sent[0]
                self._rtts.append(rtt)
                if sent[1] is not None and not sent[1].done():
                    sent[1].set_result(rtt)
        elif isinstance(msg, shm.ShmDone):
            if self.shm is not None:
                self.shm.done(msg.fds)
        elif isinstance(msg, shm.ShmAck):
            self._shm_answered(msg)
        elif isinstance(msg, Goodbye):
            self._mark_closed(LinkClosed(f"closed by peer: {msg.reason}"))
            await self._shutdown()
            return False
        else:
            # Held for the application: bounded by ``recv_queue`` messages and ``window``
            # bytes (issue 34: 64 messages of up to 2 GiB each had been held for an
            # application that did not read). A message's bytes are those read since the
            # last one queued (arrays received in place or in shared memory included).
            seen = self._bytes_received + (self.shm.received_bytes if self.shm else 0)
            nbytes, self._queued_mark = seen - self._queued_mark, seen
            if not self._queue.full():
                await self._queue.put(msg, nbytes)
                return True
            # our own application is slow: while we wait for it, the peer's silence is ours
            self._stalled = True
            try:
                await self._queue.put(msg, nbytes)
            finally:
                self._stalled = False
                self._last_rx = self._last_progress = time.monotonic()
        return True

    def _shm_answered(self, msg: shm.ShmAck) -> None:
        """Listener: the dialer answered our shared-memory challenge (at most once)."""
        offer, self._shm_offer = self._shm_offer, None
        if offer is None:
            return
        try:
            if shm.check_answer(offer, msg.pid, msg.fd):
                self.use_shm(shm.Channel(msg.pid))
                self._release_shm([msg.fd])  # the dialer may close its answer now
            else:
                log.info("link %s: shared-memory answer did not match; staying on %s",
                         self.remote.short(), self.kind)
        finally:
            os.close(offer.fd)

    def _release_shm(self, fds: list[int]) -> None:
        """Queue a ShmDone for ``fds`` and whatever else we mapped (one sender at a time)."""
        assert self.shm is not None
        self.shm.mapped += fds
        if not self._shm_done_pending:
            self._shm_done_pending = True
            self._tasks.append(asyncio.get_running_loop().create_task(self._shm_done()))

    async def _shm_done(self) -> None:
        """Tell the peer which of its segments we mapped, so it can close them."""
        try:
            await asyncio.sleep(0)  # let a burst of headers collect into one message
            assert self.shm is not None
            while self.shm.mapped:  # more may be mapped while a send waits for the line
                fds, self.shm.mapped = self.shm.mapped, []
                await self.send(shm.ShmDone(fds))
        except LinkClosed:
            pass
        finally:
            self._shm_done_pending = False
            self._tasks.remove(asyncio.current_task())  # type: ignore[arg-type]

    async def _pong(self, seq: int) -> None:
        try:
            await self.send(Pong(seq))
        except LinkClosed:
            pass
        finally:
            self._pong_pending = False
            self._tasks.remove(asyncio.current_task())  # type: ignore[arg-type]

    async def _keepalive_loop(self) -> None:
        opts = self.options
        try:
            while True:
                await asyncio.sleep(opts.keepalive_interval)
                now = time.monotonic()
                if not self._stalled and now - self._last_rx > opts.keepalive_timeout:
                    self._abort(f"keepalive timeout: nothing heard for "
                                f"{opts.keepalive_timeout:g} s")
                    return
                if (self._decoder.pending_messages and not self._stalled
                        and now - self._last_progress > opts.frame_timeout):
                    exc = ProtocolError(f"a message stayed incomplete for over "
                                        f"{opts.frame_timeout:g} s (peer stalled mid-message)")
                    self._abort(f"protocol error from peer: {exc}", exc)
                    return
                for seq, (_, fut) in list(self._pings.items()):
                    if fut is None:  # a keepalive ping whose pong never came
                        self._lost += 1
                        del self._pings[seq]
                if not self._ping_pending:  # a long send may hold the line: never block here
                    self._ping_pending = True
                    self._tasks.append(asyncio.get_running_loop().create_task(self._keepalive()))
        except LinkClosed:
            pass

    async def _keepalive(self) -> None:
        seq = next(self._ping_seq)
        self._pings[seq] = (time.perf_counter(), None)
        try:
            await self.send(Ping(seq))
        except LinkClosed:
            pass
        finally:
            self._ping_pending = False
            self._tasks.remove(asyncio.current_task())  # type: ignore[arg-type]
