"""BEP 5 write tokens: proof that a writer recently did a get from its own address.

A token is an HMAC over the requester's address and the target under a secret that rotates
every ``rotate_s``; tokens from the current and the previous secret are accepted, so a token
lives between one and two rotation periods. Fed ``now``; no clock of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import os

TOKEN_LEN = 8


class TokenIssuer:
    """Issues and checks write tokens bound to (host, port, target)."""

    def __init__(self, rotate_s: float = 300.0, now: float = 0.0) -> None:
        self.rotate_s = rotate_s
        self._secrets = [os.urandom(16), os.urandom(16)]  # [current, previous]
        self._rotated_at = now

    def _maybe_rotate(self, now: float) -> None:
        if now - self._rotated_at >= 2 * self.rotate_s:
            self._secrets = [os.urandom(16), os.urandom(16)]
            self._rotated_at = now
        elif now - self._rotated_at >= self.rotate_s:
            self._secrets = [os.urandom(16), self._secrets[0]]
            self._rotated_at = now

    @staticmethod
    def _mac(secret: bytes, addr: tuple[str, int], target: bytes) -> bytes:
        msg = f"{addr[0]}|{addr[1]}|".encode() + target
        return hmac.new(secret, msg, hashlib.sha256).digest()[:TOKEN_LEN]

    def issue(self, addr: tuple[str, int], target: bytes, now: float) -> bytes:
        self._maybe_rotate(now)
        return self._mac(self._secrets[0], addr, target)

    def check(self, token: object, addr: tuple[str, int], target: bytes, now: float) -> bool:
        self._maybe_rotate(now)
        if not isinstance(token, bytes) or len(token) != TOKEN_LEN:
            return False
        return any(hmac.compare_digest(token, self._mac(s, addr, target)) for s in self._secrets)
