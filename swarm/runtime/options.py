"""Every option a caller can pass, validated in one declarative table (as Ray's option utils).

A bad option is a TypeError (wrong kind of value or unknown name) or ValueError (right kind,
wrong value) that names the option, what it got and what it accepts, raised before anything
is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

VERIFY_MODES = ("freivalds", "replicate", "none")
PRECISIONS = ("f32", "f16", "bf16")


@dataclass(frozen=True, slots=True)
class Option:
    """One accepted option."""

    types: tuple[type, ...]
    """Accepted Python types (None allowed when ``type(None)`` is listed)."""
    default: Any
    """Value when the caller does not pass it."""
    check: Callable[[Any], bool] = lambda v: True
    """Value-level check, run after the type check."""
    accepts: str = ""
    """What the option accepts, for the error message."""


def _nonneg_number(v: Any) -> bool:
    return v is None or v >= 0


TASK_OPTIONS: dict[str, Option] = {
    "verify": Option((str,), "freivalds", lambda v: v in VERIFY_MODES,
                     "one of " + ", ".join(VERIFY_MODES)),
    "precision": Option((str,), "f32", lambda v: v in PRECISIONS,
                        "one of " + ", ".join(PRECISIONS) + " (transfer precision)"),
    "timeout": Option((int, float, type(None)), None, _nonneg_number,
                      "None or seconds >= 0 for the whole call"),
}

ACTOR_OPTIONS: dict[str, Option] = {
    "max_restarts": Option((int,), 0, lambda v: v >= -1,
                           "an int >= -1: times the actor is recreated after its host is "
                           "lost (-1 = forever)"),
    "max_task_retries": Option((int,), 0, lambda v: v >= -1,
                               "an int >= -1: times a call in flight when the actor died is "
                               "retried on the restarted actor (0 = at-most-once)"),
    "name": Option((str, type(None)), None, lambda v: v is None or 0 < len(v) <= 64,
                   "None or a name of 1-64 characters (swarm.get_actor(name) finds it)"),
}

METHOD_OPTIONS: dict[str, Option] = {
    "precision": TASK_OPTIONS["precision"],
}


def validate(table: Mapping[str, Option], given: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Return all of ``table``'s options filled from ``given``; raise on anything wrong."""
    unknown = sorted(set(given) - set(table))
    if unknown:
        raise TypeError(f"{where}: unknown option(s) {', '.join(map(repr, unknown))}; "
                        f"valid options: {', '.join(sorted(table))}")
    out = {}
    for name, opt in table.items():
        value = given.get(name, opt.default)
        if isinstance(value, bool) and bool not in opt.types or not isinstance(value, opt.types):
            raise TypeError(f"{where}: option {name}={value!r} has the wrong type; "
                            f"expected {opt.accepts}")
        if not opt.check(value):
            raise ValueError(f"{where}: option {name}={value!r} is not valid; "
                             f"expected {opt.accepts}")
        out[name] = value
    return out
