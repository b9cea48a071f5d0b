"""The systemd unit for unattended workers: restart-safe and graceful."""

from __future__ import annotations

import configparser

from tests.conftest import ROOT


def _unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.optionxform = str
    cp.read(ROOT / "contrib" / "swarm-worker.service")
    return cp


def test_unit_joins_with_consent_and_stops_gracefully():
    svc = _unit()["Service"]
    assert svc["ExecStart"].split()[1:4] == ["swarm", "join", "${SWARM_URI}"]
    assert "--yes" in svc["ExecStart"]
    assert svc["KillSignal"] == "SIGTERM" and int(svc["TimeoutStopSec"]) >= 30
    assert svc["Restart"] == "on-failure"
    # 3 = EXIT_REFUSED (kicked, blocked, no consent): restarting would loop.
    from swarm.cli import EXIT_REFUSED

    assert svc["RestartPreventExitStatus"] == str(EXIT_REFUSED)
    assert svc["Environment"].startswith("SWARM_HOME=/var/lib/") and svc["StateDirectory"]
