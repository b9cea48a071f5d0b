"""Opening the owner's authenticator: a FIDO2 security key, or the software one.

``--owner-key fido2`` opens the first USB (HID) security key, then NFC (PC/SC) when
``pyscard`` is installed; ``--owner-key soft:PATH`` opens a :class:`SoftAuthenticator`.
"""

from __future__ import annotations

import getpass
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from fido2.client import UserInteraction
from fido2.ctap import CtapDevice

from identity.errors import NoAuthenticator, OwnerKeySpecError
from identity.softkey import SoftAuthenticator

NO_KEY_MESSAGE = (
    "no FIDO2 security key found: plug in your key (on Linux you may need a udev rule for "
    "/dev/hidraw*), or use --owner-key soft:PATH for a software key that is not "
    "hardware-backed"
)


class TerminalInteraction(UserInteraction):
    """Prompts on stderr while the key waits for a touch; asks for the PIN with getpass."""

    def __init__(self, touch_prompt: str = "touch your security key",
                 stream: TextIO | None = None) -> None:
        self.touch_prompt = touch_prompt
        self.stream = stream
        self.prompts = 0
        """How many times the authenticator asked for user presence."""

    def prompt_up(self) -> None:
        self.prompts += 1
        print(self.touch_prompt, file=self.stream or sys.stderr, flush=True)

    def request_pin(self, permissions, rp_id) -> str | None:
        return getpass.getpass("PIN for your security key: ") or None


@dataclass
class Authenticator:
    """An opened authenticator and how the ceremony talks to its user."""

    device: CtapDevice
    """The CTAP device handed unmodified to ``fido2.client.Fido2Client``."""
    description: str
    """What to show the user, e.g. ``USB security key /dev/hidraw3``."""
    hardware_backed: bool
    """False for the software key; True only means "a device", attestation decides more."""
    interaction: UserInteraction = field(default_factory=TerminalInteraction)
    """PIN and touch prompts."""

    def close(self) -> None:
        self.device.close()


def open_authenticator(spec: str) -> Authenticator:
    """Open the authenticator named by an ``--owner-key`` value (``fido2`` or ``soft:PATH``)."""
    if spec.startswith("soft:"):
        path = spec[len("soft:"):]
        if not path:
            raise OwnerKeySpecError("--owner-key soft:PATH needs a file path after 'soft:'")
        device = SoftAuthenticator(Path(path).expanduser())
        return Authenticator(
            device, f"software key {device.path} (not hardware-backed)", False,
            TerminalInteraction("software key (not hardware-backed): user presence assumed"))
    if spec == "fido2":
        return _first_security_key()
    raise OwnerKeySpecError(f"unknown --owner-key {spec!r}: use 'fido2' for a security key "
                            "or 'soft:PATH' for a software key")


def _first_security_key() -> Authenticator:
    from fido2.hid import CtapHidDevice

    for dev in CtapHidDevice.list_devices():
        return Authenticator(dev, f"USB security key {dev.descriptor.path}", True)
    try:  # NFC readers: only when pyscard is installed and pcscd answers
        from fido2.pcsc import CtapPcscDevice
    except ImportError:
        pass
    else:
        try:
            for dev in CtapPcscDevice.list_devices():
                return Authenticator(dev, f"NFC security key {dev}", True)
        except Exception:  # no PC/SC service (pcscd) is the same as no reader
            pass
    raise NoAuthenticator(NO_KEY_MESSAGE)
