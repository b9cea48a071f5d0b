"""ICE servers (STUN/TURN) in the WebRTC convention, from ``SWARM_ICE_SERVERS`` and
``--ice-server``.

``SWARM_ICE_SERVERS`` is a JSON list of RTCIceServer objects, as a browser takes them::

    [{"urls": ["turn:turn.example.org:3478"], "username": "u", "credential": "secret"}]

``--ice-server URL`` (repeatable) adds one server per URL; a TURN URL may carry its
credentials as ``turn:USER:CREDENTIAL@HOST:PORT`` (they are split off, never kept in the URL).
Credentials never appear in logs or errors: :func:`describe` shows URLs only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from swarm.errors import ConfigError

if TYPE_CHECKING:  # aiortc is imported where a server is built: every networked command
    from aiortc import RTCIceServer  # parses the flags, few use WebRTC (4 s of a loaded
    # `swarm status`'s imports went to aiortc and its dependencies)

ENV = "SWARM_ICE_SERVERS"
MAX_SERVERS = 16
MAX_FIELD = 512
_URL = re.compile(r"^(stun|stuns|turn|turns):(?:(?P<cred>[^@/?\s]+)@)?(?P<rest>[^@\s]+)$")


def _url(text: object, where: str) -> tuple[str, str | None, str | None]:
    """(url without credentials, username, credential) of one ICE URL; ConfigError if bad."""
    if not isinstance(text, str) or not text or len(text) > MAX_FIELD:
        raise ConfigError(f"{where}: an ICE server URL must be a non-empty string "
                          f"of at most {MAX_FIELD} characters")
    m = _URL.match(text)
    if m is None:
        shown = text.split("@")[-1] if "@" in text else text
        raise ConfigError(f"{where}: {shown!r} is not a stun:, stuns:, turn: or turns: URL")
    user = cred = None
    if m.group("cred"):
        if not m.group(1).startswith("turn"):
            raise ConfigError(f"{where}: only TURN URLs carry credentials")
        user, sep, cred = m.group("cred").partition(":")
        if not sep or not user or not cred:
            raise ConfigError(f"{where}: credentials in a URL are USER:CREDENTIAL@")
    return f"{m.group(1)}:{m.group('rest')}", user, cred


def _server(obj: object, where: str) -> RTCIceServer:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: each ICE server is an object with urls, username, "
                          "credential")
    unknown = set(obj) - {"urls", "username", "credential", "credentialType"}
    if unknown:
        raise ConfigError(f"{where}: unknown ICE server field(s) {sorted(unknown)}")
    urls = obj.get("urls")
    if isinstance(urls, str):
        urls = [urls]
    if not isinstance(urls, list) or not urls or len(urls) > MAX_SERVERS:
        raise ConfigError(f"{where}: urls must be a URL or a list of 1-{MAX_SERVERS} URLs")
    for name in ("username", "credential"):
        value = obj.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > MAX_FIELD):
            raise ConfigError(f"{where}: {name} must be a string of at most {MAX_FIELD} "
                              "characters")
    clean = [_url(u, where)[0] for u in urls]
    if any(u.startswith("turn") for u in clean) and not (obj.get("username")
                                                         and obj.get("credential")):
        raise ConfigError(f"{where}: a TURN server needs username and credential")
    from aiortc import RTCIceServer

    return RTCIceServer(urls=clean, username=obj.get("username"),
                        credential=obj.get("credential"))


def parse_env(text: str) -> list[RTCIceServer]:
    """The servers in a ``SWARM_ICE_SERVERS`` value (ConfigError naming what is wrong)."""
    if len(text) > MAX_SERVERS * 4 * MAX_FIELD:
        raise ConfigError(f"{ENV} is too long")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{ENV} is not JSON: {exc.msg} at character {exc.pos}") from None
    if not isinstance(data, list) or len(data) > MAX_SERVERS:
        raise ConfigError(f"{ENV} must be a JSON list of at most {MAX_SERVERS} RTCIceServer "
                          "objects")
    return [_server(obj, f"{ENV}[{i}]") for i, obj in enumerate(data)]


def parse_flag(text: str) -> RTCIceServer:
    """One ``--ice-server URL`` (credentials may ride as ``turn:USER:CRED@HOST:PORT``)."""
    url, user, cred = _url(text, "--ice-server")
    if url.startswith("turn") and user is None:
        raise ConfigError("--ice-server: a TURN URL needs credentials "
                          "(turn:USER:CREDENTIAL@HOST:PORT) or use SWARM_ICE_SERVERS")
    from aiortc import RTCIceServer

    return RTCIceServer(urls=[url], username=user, credential=cred)


def ice_servers(flags: Sequence[str] = (), env: Mapping[str, str] | None = None
                ) -> list[RTCIceServer]:
    """Servers from ``env[SWARM_ICE_SERVERS]`` then each ``--ice-server`` flag."""
    text = (env or {}).get(ENV, "").strip()
    servers = parse_env(text) if text else []
    servers += [parse_flag(f) for f in flags]
    if len(servers) > MAX_SERVERS:
        raise ConfigError(f"at most {MAX_SERVERS} ICE servers")
    return servers


def describe(servers: Sequence[RTCIceServer]) -> str:
    """The servers for a log line: URLs only, never a username or credential."""
    urls = [u for s in servers for u in ([s.urls] if isinstance(s.urls, str) else s.urls)]
    return ", ".join(urls) if urls else "none"
