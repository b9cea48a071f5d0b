"""Conventions every command shares: the data directory and logging.

The data dir holds keys, consent, DHT state and caches, so it is created 0700 and a
looser one is tightened (with a warning) rather than trusted.
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


class _Formatter(logging.Formatter):
    """One line per record, journald-friendly: `<N>` syslog priority prefix when not a tty."""

    _PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
                 logging.CRITICAL: 2}

    def __init__(self, journald: bool) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
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
