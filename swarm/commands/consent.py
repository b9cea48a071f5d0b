"""Consent to join a swarm: asked once per swarm, remembered only when the user says so.

Joining lends this machine's compute to strangers, so ``swarm join`` asks first:
"Always join" (remembered per swarm in the data dir), "Join this time", "Not now".
Scripts pass ``--yes``. With no terminal to ask and nothing remembered, joining is refused
with a message naming ``--yes`` rather than hanging on a prompt nobody will answer.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from pathlib import Path
from typing import TextIO

from identity.files import write_private
from swarm.errors import ConsentRefused

FILE = "consent.json"
log = logging.getLogger("swarm.consent")


class Decision(enum.Enum):
    ALWAYS = "always"
    ONCE = "once"
    NOT_NOW = "not-now"


_ANSWERS = {"a": Decision.ALWAYS, "always": Decision.ALWAYS, "o": Decision.ONCE,
            "once": Decision.ONCE, "j": Decision.ONCE, "y": Decision.ONCE, "yes": Decision.ONCE,
            "n": Decision.NOT_NOW, "no": Decision.NOT_NOW, "not now": Decision.NOT_NOW,
            "": Decision.NOT_NOW}


class ConsentStore:
    """The swarms this user said "Always join" to, as ``consent.json`` in the data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / FILE

    def _load(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            log.warning("ignoring unreadable consent file %s", self.path)
            return {}
        return data if isinstance(data, dict) else {}

    def remembered(self, swarm_id: bytes) -> bool:
        entry = self._load().get(swarm_id.hex())
        return isinstance(entry, dict) and entry.get("decision") == Decision.ALWAYS.value

    def remember(self, swarm_id: bytes, name: str) -> None:
        data = self._load()
        data[swarm_id.hex()] = {"decision": Decision.ALWAYS.value, "name": name,
                                "at": int(time.time())}
        self._save(data)

    def forget(self, swarm_id: bytes) -> None:
        data = self._load()
        if data.pop(swarm_id.hex(), None) is not None:
            self._save(data)

    def _save(self, data: dict) -> None:
        write_private(self.path, json.dumps(data, indent=1, sort_keys=True).encode())


PROMPT = """\
Join swarm {name!r} ({short})?
Its members will run compute tasks (matrix multiplications) on this machine.
  [a] Always join this swarm
  [o] Join this time
  [n] Not now
Choice [a/o/N]: """


def obtain(data_dir: Path, swarm_id: bytes, name: str, *, yes: bool = False,
           stdin: TextIO | None = None, stdout: TextIO | None = None) -> Decision:
    """Return how the user consents to join, or raise :class:`ConsentRefused`."""
    import sys

    store = ConsentStore(data_dir)
    if store.remembered(swarm_id):
        return Decision.ALWAYS
    if yes:
        return Decision.ONCE
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stderr
    if stdin is None or stdin.closed or not stdin.isatty():
        raise ConsentRefused(
            f"no terminal to ask whether to join swarm {name!r} and no remembered consent; "
            "pass --yes to join non-interactively (or run once on a terminal and choose "
            "'Always join')"
        )
    stdout.write(PROMPT.format(name=name, short=swarm_id.hex()[:12]))
    stdout.flush()
    answer = stdin.readline()
    decision = _ANSWERS.get(answer.strip().lower())
    if decision is None:
        raise ConsentRefused(f"not joining swarm {name!r}: answer {answer.strip()[:20]!r} "
                             "is not a, o or n")
    if decision is Decision.NOT_NOW:
        raise ConsentRefused(f"not joining swarm {name!r} (declined)")
    if decision is Decision.ALWAYS:
        store.remember(swarm_id, name)
    return decision
