"""Which ``Host`` names the node's web side answers (DNS rebinding, issue 34).

A page served as evil.example whose name the attacker then points at the node's address
(127.0.0.1 for a node on the visitor's own machine) is same-origin with itself: its
``Origin`` and ``Host`` headers agree, so comparing them let it speak the join protocol and
read ``/status.json``. The defence is the name: every route answers only requests whose
``Host`` is an IP literal (rebinding needs a name the attacker controls), ``localhost`` or a
``.localhost`` name (browsers resolve those to loopback themselves), the ``--http`` host, this
machine's own host names, or a name the operator adds. Anything else gets 421.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web


def _name(host: str) -> str:
    """The host part of a ``Host`` header, lower case, without port, brackets or final dot."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def allowed_names(http_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names to answer besides IP literals and ``localhost``: the ``--http`` host, this
    machine's host names, and ``extra`` (the operator's)."""
    names = {http_host, *extra}
    try:
        me = socket.gethostname()
        names.update({me, f"{me}.local", socket.getfqdn()})  # .local: mDNS on a LAN
    except OSError:
        pass
    return frozenset(_name(n) for n in names if n)


def host_allowed(host: str | None, names: frozenset[str]) -> bool:
    if not host:
        return False
    name = _name(host)
    return (_is_ip(name) or name == "localhost" or name.endswith(".localhost")
            or name in names)


def host_guard(names: frozenset[str]
               ) -> Callable[[web.Request, Callable[[web.Request], Awaitable[web.StreamResponse]]],
                             Awaitable[web.StreamResponse]]:
    """aiohttp middleware refusing requests whose ``Host`` is not one of ours."""

    @web.middleware
    async def guard(request: web.Request, handler) -> web.StreamResponse:
        if not host_allowed(request.headers.get("Host"), names):
            raise web.HTTPMisdirectedRequest(
                text="this node does not answer to that host name (DNS rebinding guard); "
                     "open it by its address or localhost, or have its operator add the name")
        return await handler(request)

    return guard
