"""Shared helpers for the identity tests: software owner keys and chain builders."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from identity import (
    Authenticator,
    OwnerCredential,
    PeerKey,
    Signed,
    SoftAuthenticator,
    Statement,
    TerminalInteraction,
    assert_statement,
    enrol,
)


class CountingInteraction(TerminalInteraction):
    """Records prompts instead of printing them."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def prompt_up(self) -> None:
        self.prompts += 1
        self.messages.append(self.touch_prompt)


def soft_authenticator(path: Path, **kwargs) -> Authenticator:
    return Authenticator(SoftAuthenticator(path, **kwargs), f"soft {path.name}", False,
                         CountingInteraction())


@dataclass
class OwnerKey:
    """An enrolled software owner key, ready to sign statements."""

    authenticator: Authenticator
    credential: OwnerCredential

    def sign(self, statement: Statement, **kwargs) -> Signed:
        return Signed(statement, (assert_statement(self.authenticator, self.credential,
                                                   statement, **kwargs),))

    def proof(self, statement: Statement, **kwargs):
        return assert_statement(self.authenticator, self.credential, statement, **kwargs)


def owner_key(tmp_path: Path, name: str, **enrol_kwargs) -> OwnerKey:
    auth = soft_authenticator(tmp_path / f"{name}.key")
    return OwnerKey(auth, enrol(auth, **enrol_kwargs))


def swarm_key() -> PeerKey:
    return PeerKey.generate()
