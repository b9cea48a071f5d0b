"""Shared memory between co-located peers: large arrays skip TLS and land in numpy zero-copy.

Why: on one machine TLS costs an encryption, a decryption and two copies per byte on each
side's event loop; shared memory costs one copy by the sender and none by the receiver.

How (Linux): the sender writes an array's bytes into a fresh ``memfd`` and *seals* it
(no writes, no resizing ever again, by anybody), then sends the message header over the TLS
link as usual, the array naming ``(fd number)`` instead of being chunked. The receiver opens
``/proc/<sender pid>/fd/<n>``, checks the seals and the size, maps it copy-on-write and hands
numpy a view of the mapping: no copy, and the sender cannot change the bytes after they were
verified. The receiver then says :class:`ShmDone` and the sender closes its descriptor.
Nothing has a name in any filesystem, so nothing can leak: when either process dies (even by
SIGKILL) the kernel closes its descriptors and unmaps its views, and the memory is freed once
neither side holds it.

Who is at the other end is still proven by the TLS handshake: every header (and so every
descriptor number) arrives on the authenticated link, and the sender's pid is pinned by a
challenge at link set-up: the listener puts a random nonce in a sealed memfd and names it in
its :class:`~swarm.links.tls.Welcome`; the dialer reads it through ``/proc``, puts it in a
sealed memfd of its own and names that in :class:`ShmAck`; the listener reads it back. Only
a peer on this machine, in the same pid namespace, with the same user, can answer. Links to
peers that are not on this host (an address that is not loopback and not one of ours: another
machine, another network namespace) never try; ``SWARM_SHM=0`` turns the path off.

Writing a segment costs about as much as hashing the bytes (the kernel allocates and
zeroes its pages): :data:`SEGMENTS` writes an array *once*, ahead of the send and off the
event loop (:meth:`Segments.prepared`), and every link that sends that array meanwhile names
a duplicate of the one descriptor. A weight sent to every co-located worker is written once,
and the loop keeps moving other links' data while it is written.

Bounds: a sender keeps at most :data:`MAX_OPEN` descriptors (and :data:`MAX_OPEN_BYTES`)
waiting for a ShmDone per link, :data:`MAX_OPEN_PER_PROCESS` per peer process and
:data:`MAX_OPEN_TOTAL` in all; past that it sends over TLS, so a receiver that never answers
costs it nothing unbounded. A receiver only maps what the decoder's limits already accept.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import ipaddress
import logging
import mmap
import os
import secrets
import stat
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from swarm import wire
from swarm.errors import ProtocolError

log = logging.getLogger(__name__)

ENV = "SWARM_SHM"
MIN_BYTES = wire.INLINE_MAX + 1
"""Arrays at least this large go through shared memory (smaller ones ride in the header)."""
MAX_OPEN = 64
"""Descriptors a sender keeps open waiting for the receiver's ShmDone."""
MAX_OPEN_BYTES = 1 << 30
"""Bytes a sender keeps in shared memory waiting for ShmDone."""
MAX_OPEN_PER_PROCESS = 2 * MAX_OPEN
"""Descriptors waiting for ShmDone from one peer process over all of its links (a requester
opening many links, or many keys in one process, gets one share: issue 34)."""
MAX_OPEN_TOTAL = 1024
"""Descriptors waiting for ShmDone from all peers together (past it, arrays go in-band)."""
_waiting_by_pid: dict[int, int] = {}
PLACE_MIN = 1 << 20
"""Received segments this large keep a descriptor while needed (see :class:`Segment`);
smaller ones cost little to copy."""
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_NONCE = 32


@wire.message("link.shm-ack")
class ShmAck(wire.Message):
    """The dialer read the listener's challenge and echoes it from its own memory."""

    pid: int
    """The dialer's process id (its memfds are read through /proc/<pid>/fd)."""
    fd: int
    """A sealed memfd in that process holding the listener's nonce."""


@wire.message("link.shm-done")
class ShmDone(wire.Message):
    """The receiver mapped these descriptors: the sender may close them."""

    fds: list[int]
    """Descriptor numbers in the sender's process, as named in the headers."""


@dataclass(frozen=True)
class Offer:
    """The listener's challenge, named in its Welcome."""

    pid: int
    """The listener's process id."""
    fd: int
    """A sealed memfd holding ``nonce``."""
    nonce: bytes
    """What the dialer must echo (never sent in the clear: it is read through /proc)."""


def supported() -> bool:
    """Whether this process may use shared-memory links (Linux, /proc, not switched off)."""
    return os.environ.get(ENV, "1") != "0" and _platform()


@functools.cache
def _platform() -> bool:
    """Linux with memfd and /proc. Asked once: :func:`supported` runs on the event loop before
    every send, and a stat lets go of the GIL (getting it back from a busy thread took ms)."""
    if not (sys.platform.startswith("linux") and hasattr(os, "memfd_create")
            and os.path.isdir(f"/proc/{os.getpid()}/fd")):
        return False
    _raise_fd_limit()
    return True


@functools.cache
def _raise_fd_limit() -> None:
    """Each received array's mapping holds a descriptor while the array lives (CPython's
    mmap keeps one): lift the soft limit to the hard one, as Ray does."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.debug("cannot raise the descriptor limit: %s", exc)


def local_addresses() -> set[str]:
    """This host's interface addresses (in this network namespace)."""
    import psutil

    out = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name in ("AF_INET", "AF_INET6"):
                out.add(a.address.split("%")[0])
    return out


def colocated(host: str) -> bool:
    """Whether ``host`` is this machine, as seen from this network namespace."""
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return colocated(str(ip.ipv4_mapped))
    return str(ip) in local_addresses()


def _sealed(data: bytes | memoryview) -> int:
    """A new sealed memfd holding ``data``; the caller owns the descriptor."""
    fd = os.memfd_create("swarm-shm", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open(pid: int, fd: int, nbytes: int) -> int:
    """Open a peer's sealed memfd of exactly ``nbytes``; ProtocolError otherwise."""
    if not (type(pid) is int and type(fd) is int and 0 < pid < 1 << 22 and 0 <= fd < 1 << 20):
        raise ProtocolError("bad shared-memory reference")
    try:
        mine = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ProtocolError(f"shared-memory descriptor {fd} of pid {pid}: {exc.strerror}"
                            ) from None
    try:
        st = os.fstat(mine)
        if not stat.S_ISREG(st.st_mode) or st.st_size != nbytes:
            raise ProtocolError(f"shared-memory descriptor {fd} is not a {nbytes}-byte segment")
        if st.st_uid != os.getuid() or fcntl.fcntl(mine, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
            raise ProtocolError(f"shared-memory descriptor {fd} is not sealed (it could change "
                                "after it was checked)")
    except OSError as exc:
        os.close(mine)
        raise ProtocolError(f"shared-memory descriptor {fd}: {exc.strerror}") from None
    except BaseException:
        os.close(mine)
        raise
    return mine


class _Descriptor:
    """A descriptor closed exactly once (by :meth:`close` or by its segment's finalizer)."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class Segment(mmap.mmap):
    """A peer's sealed segment of at least :data:`PLACE_MIN` bytes, mapped copy-on-write,
    with a descriptor of our own kept until :func:`settle` (or until it is collected): a
    job maps the segment again at its place in an output (:mod:`swarm.links.assembly`)
    instead of copying it there."""

    descriptor: _Descriptor
    address: int
    """Where this mapping starts."""


def map_array(pid: int, fd: int, nbytes: int) -> np.ndarray:
    """A writable (copy-on-write) uint8 view of a peer's sealed segment: no copy is made."""
    mine = _open(pid, fd, nbytes)
    kept = False
    try:
        if nbytes == 0:
            return np.empty(0, np.uint8)
        if nbytes < PLACE_MIN:
            return np.frombuffer(mmap.mmap(mine, nbytes, access=mmap.ACCESS_COPY), np.uint8)
        seg = Segment(mine, nbytes, access=mmap.ACCESS_COPY)
        seg.descriptor = _Descriptor(mine)
        weakref.finalize(seg, seg.descriptor.close)
        kept = True
        out = np.frombuffer(seg, np.uint8)
        seg.address = out.__array_interface__["data"][0]
        return out
    except (OSError, ValueError) as exc:
        raise ProtocolError(f"cannot map shared-memory descriptor {fd}: {exc}") from None
    finally:
        if not kept:
            os.close(mine)  # the mapping keeps the memory; the descriptor is not needed


def segment_of(arr: np.ndarray) -> Segment | None:
    """The received segment ``arr`` is the whole of (same start, same size), if any, whose
    descriptor is still kept."""
    base: object = arr
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, Segment) or base.descriptor.fd is None:
        return None
    if arr.nbytes != len(base) or arr.__array_interface__["data"][0] != base.address:
        return None
    return base


def _mapping_of(arr: np.ndarray) -> mmap.mmap | None:
    """The received mapping ``arr`` lives in, if any."""
    base: object = arr
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if isinstance(base, mmap.mmap) else None


def mapped(arr: np.ndarray) -> bool:
    """Whether ``arr`` lives in a received mapping (which holds a descriptor while it lives:
    Python's mmap keeps a duplicate of the one it was made from)."""
    return _mapping_of(arr) is not None


MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
"""Linux 5.14+: map every page of a range now, in one call (Python 3.11 lacks the name)."""


def populate(arr: np.ndarray) -> None:
    """Map all of the received mapping ``arr`` lives in at once, before a pass over it: one
    call instead of a page fault per 64 KiB (the kernel's fault-around; a 42 MB trace:
    ~650). No-op elsewhere."""
    mapping = _mapping_of(arr)
    if mapping is not None:
        with contextlib.suppress(OSError, ValueError):  # an older kernel: faults as before
            mapping.madvise(MADV_POPULATE_READ)


def settle(arr: np.ndarray) -> None:
    """``arr`` stays where it is: close the descriptor its segment kept (the mapping stays)."""
    seg = segment_of(arr)
    if seg is not None:
        seg.descriptor.close()


def make_offer() -> Offer:
    """A challenge for a dialer that claims to be on this host."""
    nonce = secrets.token_bytes(_NONCE)
    return Offer(os.getpid(), _sealed(nonce), nonce)


def answer(pid: int, fd: int) -> int:
    """Dialer: read the listener's challenge and echo it from a memfd of ours (its fd)."""
    return _sealed(bytes(map_array(pid, fd, _NONCE)))


def check_answer(offer: Offer, pid: int, fd: int) -> bool:
    """Listener: whether the dialer echoed our nonce from its own sealed memory."""
    try:
        return secrets.compare_digest(bytes(map_array(pid, fd, _NONCE)), offer.nonce)
    except ProtocolError as exc:
        log.info("shared-memory answer refused: %s", exc)
        return False


class Channel:
    """One link's shared-memory state: descriptors we sent, and the peer we read from."""

    def __init__(self, peer_pid: int) -> None:
        self.peer_pid = peer_pid
        """The process whose descriptors this link reads (pinned at the handshake)."""
        self._open: dict[int, int] = {}  # fd -> bytes, waiting for the peer's ShmDone
        self._open_bytes = 0
        self.sent = 0
        """Arrays sent through shared memory (tests assert the path is used)."""
        self.received = 0
        """Arrays received through shared memory."""
        self.received_bytes = 0
        """Their bytes (a link counts them against what it holds for its application)."""
        self.mapped: list[int] = []
        """The peer's descriptors we mapped and have not yet told it about (ShmDone)."""

    def spill(self, data: memoryview) -> int | None:
        """Put ``data`` in a sealed segment (a prepared one when :data:`SEGMENTS` holds it);
        its fd, or None to send it over the link."""
        if (len(self._open) >= MAX_OPEN or self._open_bytes + len(data) > MAX_OPEN_BYTES
                or _waiting_by_pid.get(self.peer_pid, 0) >= MAX_OPEN_PER_PROCESS
                or sum(_waiting_by_pid.values()) >= MAX_OPEN_TOTAL):
            return None
        fd = SEGMENTS.take(data)
        if fd is None:
            fd = _sealed(data)
        self.hold(fd, len(data))
        self.sent += 1
        return fd

    def hold(self, fd: int, nbytes: int) -> None:
        """Keep our descriptor ``fd`` open until the peer's ShmDone names it."""
        self._open[fd] = nbytes
        self._open_bytes += nbytes
        _waiting_by_pid[self.peer_pid] = _waiting_by_pid.get(self.peer_pid, 0) + 1

    def resolve(self, fd: int, nbytes: int) -> np.ndarray:
        """The peer's segment ``fd`` as a zero-copy uint8 array (ProtocolError if bad)."""
        out = map_array(self.peer_pid, fd, nbytes)
        self.received += 1
        self.received_bytes += nbytes
        self.mapped.append(fd)
        return out

    def done(self, fds: list[int]) -> None:
        """The peer mapped these: close them (unknown numbers are ignored, never closed)."""
        for fd in fds:
            size = self._open.pop(fd, None)
            if size is not None:
                self._open_bytes -= size
                os.close(fd)
                left = _waiting_by_pid.pop(self.peer_pid, 1) - 1
                if left > 0:
                    _waiting_by_pid[self.peer_pid] = left

    def close(self) -> None:
        """The link is gone: close every descriptor still waiting."""
        self.done(list(self._open))

    @property
    def waiting(self) -> int:
        """Descriptors sent and not yet released by the peer."""
        return len(self._open)


def _key(data: memoryview | np.ndarray) -> tuple[int, int]:
    """Where an array's bytes live: (address, size). Equal keys of live arrays mean the
    same memory, hence the same bytes."""
    arr = np.frombuffer(data, np.uint8) if isinstance(data, memoryview) else data
    return arr.__array_interface__["data"][0], arr.nbytes


@dataclass(eq=False)
class _Prepared:
    users: int = 1
    fd: int | None = None
    ready: threading.Event = field(default_factory=threading.Event)


class Segments:
    """Sealed segments written ahead of a send, once, and shared by every link that sends them.

    An entry lives only between :meth:`prepare` and the matching :meth:`release`, while the
    caller holds the array: it is found by the array's memory (address, size), and an array
    that later takes the same memory never meets a stale segment. Sealed, so no link (and
    no receiver) can change what another one maps.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, int], _Prepared] = {}
        self.written = 0
        """Segments written by :meth:`prepare` (tests assert one per array, not per link)."""
        self.written_bytes = 0
        """Their bytes."""

    def prepare(self, arr: np.ndarray) -> tuple[int, int]:
        """Blocking (call it off the loop): write ``arr`` (C-contiguous) into a sealed segment
        unless one is already prepared; returns the key to :meth:`release`."""
        key = _key(arr)
        with self._lock:
            entry = self._entries.get(key)
            writer = entry is None
            if writer:
                entry = self._entries[key] = _Prepared()
            else:
                entry.users += 1
        if not writer:
            entry.ready.wait()  # another thread writes it: share that segment
            return key
        try:
            fd = _sealed(memoryview(arr).cast("B"))
        except OSError as exc:  # out of memory, say: each link then tries on its own
            log.debug("cannot prepare a shared-memory segment: %s", exc)
        else:
            with self._lock:
                entry.fd = fd
                self.written += 1
                self.written_bytes += arr.nbytes
        finally:
            entry.ready.set()
        return key

    def release(self, key: tuple[int, int]) -> None:
        """One :meth:`prepare` is done with its entry; the last closes the descriptor."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry.users -= 1
            if entry.users > 0:
                return
            del self._entries[key]
            if entry.fd is not None:
                os.close(entry.fd)

    def take(self, data: memoryview) -> int | None:
        """A new descriptor (the caller owns it) for the prepared segment holding ``data``."""
        with self._lock:
            entry = self._entries.get(_key(data))
            if entry is None or entry.fd is None:
                return None
            return os.dup(entry.fd)

    @contextlib.asynccontextmanager
    async def prepared(self, arrays: Sequence[np.ndarray]) -> AsyncIterator[None]:
        """Within this block, links send these arrays from segments written once, in a
        worker thread (arrays too small for shared memory, or not contiguous, are left out)."""
        big = [a for a in arrays
               if a.nbytes >= MIN_BYTES and a.flags.c_contiguous and a.dtype.kind in "fiucb"]
        if not big or not supported():
            yield
            return
        job = asyncio.get_running_loop().run_in_executor(
            None, lambda: [self.prepare(a) for a in big])
        try:
            keys = await asyncio.shield(job)
        except asyncio.CancelledError:
            job.add_done_callback(self._release_later)
            raise
        try:
            yield
        finally:
            for key in keys:
                self.release(key)

    def _release_later(self, job: asyncio.Future) -> None:
        if not job.cancelled() and job.exception() is None:
            for key in job.result():
                self.release(key)

    @property
    def held(self) -> int:
        """Entries prepared and not yet released."""
        return len(self._entries)


SEGMENTS = Segments()
"""This process's prepared segments (one table: a segment is shared by all of its links)."""


__all__ = ["Channel", "ENV", "Offer", "ShmAck", "ShmDone", "answer", "check_answer",
           "SEGMENTS", "Segment", "Segments", "colocated", "make_offer", "map_array",
           "mapped", "segment_of", "settle", "supported"]
