"""Conventions every command shares: the data directory and logging.

The data dir holds keys, consent, DHT state and caches, so it is created 0700 and a
looser one is tightened (with a warning) rather than trusted. Its ``peer.key`` is a
member's identity, so a process that serves (``publish``, ``join``, ``dht serve``) holds an
OS lock on its dir for its whole life (:func:`claim_data_dir`): two members never share
one identity, and a second one started with the default dir gets its own next to it.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from pathlib import Path

import platformdirs

from swarm.errors import ConfigError

ENV_HOME = "SWARM_HOME"
LOCK_FILE = "lock"
MAX_DATA_DIRS = 16
"""Default dirs tried by :func:`claim_data_dir`: ``swarm``, ``swarm-2`` ... ``swarm-16``."""
_held: dict[Path, int] = {}  # locked dirs -> their lock fds, kept open for the process's life
log = logging.getLogger("swarm.config")


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return the data dir, created with mode 0700.

    Precedence: ``explicit`` (``--data-dir``), then ``$SWARM_HOME``, then the platform's
    user data dir (``~/.local/share/swarm`` on Linux).
    """
    raw = explicit or os.environ.get(ENV_HOME) or platformdirs.user_data_dir("swarm", False)
    path = Path(raw).expanduser()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create data dir {path}: {exc.strerror}") from exc
    if not path.is_dir():
        raise ConfigError(f"data dir {path} exists and is not a directory")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("data dir %s had mode %o; tightening to 700", path, mode)
        path.chmod(0o700)
    return path


def claim_data_dir(path: Path, given: bool) -> Path:
    """Lock ``path`` (already made by :func:`data_dir`) for this process's life and return
    it. When another process holds it: a ``given`` dir (``--data-dir``, ``$SWARM_HOME``) is a
    :class:`ConfigError` naming that process; the default one is passed over for the first
    free sibling (``swarm-2``, ``swarm-3`` ...), which then holds this instance's own
    identity. The lock is ``flock`` on ``DIR/lock``: the OS drops it when the process ends,
    even by SIGKILL, so a crash leaves nothing stale."""
    holder = _lock(path)
    if holder is None:
        return path
    if given:
        raise ConfigError(f"data dir {path} is in use by {holder}; stop it or give this one "
                          f"another --data-dir")
    for n in range(2, MAX_DATA_DIRS + 1):
        sibling = data_dir(path.with_name(f"{path.name}-{n}"))
        if _lock(sibling) is None:
            log.info("data dir %s is in use by %s; using %s", path, holder, sibling)
            return sibling
    raise ConfigError(f"{MAX_DATA_DIRS} swarm processes already run from {path} and its "
                      f"siblings; give this one its own --data-dir")


def _lock(path: Path) -> str | None:
    """Take the lock on ``path``; None once held, else who holds it (for messages)."""
    if path in _held:
        return None
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock to take, as before
        return None
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pid = os.read(fd, 16).decode("ascii", "replace").strip()
        os.close(fd)
        return f"process {pid}" if pid.isdigit() else "another process"
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[path] = fd
    return None


MAX_LINE = 200
"""Log lines are cut to this below -vv: a line the user reads is one line, not a dump."""


class _Formatter(logging.Formatter):
    """One line per record, journald-friendly: `<N>` syslog priority prefix when not a tty."""

    _PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
                 logging.CRITICAL: 2}

    def __init__(self, journald: bool) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if len(line) > MAX_LINE and logging.getLogger().level > logging.DEBUG:
            line = line[:MAX_LINE - 26] + f"... ({len(line)} chars; -vv)"
        if self.journald:
            return f"<{self._PRIORITY.get(record.levelno, 6)}>{line}"
        return line


def setup_logging(verbosity: int = 0, stream=None) -> None:
    """Configure the root logger: 0 -> WARNING, 1 -> INFO, 2+ -> DEBUG, -1 -> ERROR.

    Under systemd (``$JOURNAL_STREAM`` set) lines carry a ``<N>`` priority prefix.
    """
    level = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}.get(
        max(-1, min(verbosity, 2)), logging.DEBUG
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_Formatter(journald=bool(os.environ.get("JOURNAL_STREAM"))))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Third-party libraries are chatty at INFO; keep them one step quieter. Not "wgpu": it
    # sets its own logger to WARNING on import, and refuses to import (AssertionError) if a
    # plain logger of that name exists already.
    # Their WARNINGs are routine in a swarm ("no response from X, removing from router"
    # whenever a peer leaves), so they show only from -v on.
    third_party = logging.ERROR if level >= logging.WARNING else max(level, logging.WARNING)
    for noisy in ("kademlia", "rpcudp", "aioice", "aiortc", "fido2"):
        logging.getLogger(noisy).setLevel(third_party)
