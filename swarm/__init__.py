"""swarm: a Ray-like actor runtime over a swarm of volunteer machines.

Exceptions (all in :mod:`swarm.errors`)::

    SwarmError                 base of everything this package raises on purpose
    +-- ConfigError            bad option, unusable data dir, bad URI (local, before any I/O)
    |   +-- URIError           a join URI that does not parse (names the wrong part)
    +-- ConsentRefused         the user (or a missing terminal) declined to join
    |   +-- Blocked            this peer is blocked from the swarm (its data dir says so)
    +-- GetTimeoutError        get() ran out of time (also a TimeoutError)
    +-- TaskCancelledError     get() of a cancelled task (also a futures CancelledError)
    +-- LocalError             something failed on this machine
    +-- RemoteError            a peer answered with an error or broke the protocol
        +-- ProtocolError      malformed or oversized frame; the link is closed
        +-- AuthenticationError  a peer is not who it claims/was expected to be
        +-- LinkClosed         a peer link closed (also a ConnectionError); .reason, .error
        +-- TaskError          a task failed on every attempt it was allowed
        +-- ActorDiedError     an actor's host was lost beyond max_restarts
        +-- CharterError       a swarm's charter is missing, forged or not the pinned owner's
        +-- StaleTerm          a command from a term below the highest seen (fencing)
        +-- NotCoordinator     a coordinator-only command reached a peer that is not it

Local and remote errors stay apart so that callers can tell "my input is wrong"
from "a peer misbehaved" (the latter is retried elsewhere and counts against the peer).
"""

from swarm.errors import (
    ActorDiedError,
    AuthenticationError,
    Blocked,
    CharterError,
    ConfigError,
    ConsentRefused,
    GetTimeoutError,
    LinkClosed,
    LocalError,
    NotCoordinator,
    ProtocolError,
    RemoteError,
    StaleTerm,
    SwarmError,
    TaskCancelledError,
    TaskError,
    URIError,
)

__version__ = "0.1.0"

# The runtime API, imported on first use so that `swarm --help` stays fast.
_LAZY = {
    "connect": "swarm.api", "local": "swarm.api", "Client": "swarm.api",
    "LocalSwarm": "swarm.api", "ActorHandle": "swarm.api",
    "put": "swarm.api", "cancel": "swarm.api", "kill": "swarm.api",
    "get_actor": "swarm.api", "remote": "swarm.api",
    "get": "swarm.runtime.refs", "wait": "swarm.runtime.refs",
    "ObjectRef": "swarm.runtime.refs",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'swarm' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Blocked",
    "CharterError",
    "ActorDiedError",
    "ActorHandle",
    "Client",
    "GetTimeoutError",
    "LocalSwarm",
    "ObjectRef",
    "TaskCancelledError",
    "TaskError",
    "cancel",
    "connect",
    "get",
    "get_actor",
    "kill",
    "put",
    "remote",
    "local",
    "wait",
    "AuthenticationError",
    "ConfigError",
    "ConsentRefused",
    "LinkClosed",
    "LocalError",
    "NotCoordinator",
    "ProtocolError",
    "RemoteError",
    "StaleTerm",
    "SwarmError",
    "URIError",
    "__version__",
]
