"""`swarm.api.local`'s error path (issue 36): a failure before or while the client node
starts surfaces as itself; a failure to stop that node is logged, never lost."""

from __future__ import annotations

import logging

import pytest

from swarm import api


class _Node:
    find_coordinator = None

    async def start(self) -> None:
        raise RuntimeError("cannot start")

    async def stop(self, graceful: bool = True) -> None:
        raise OSError("cannot stop")


def test_a_node_that_cannot_be_made_surfaces_its_own_error(monkeypatch, tmp_path, caplog):
    async def no_node(config, key):
        raise RuntimeError("no node")

    monkeypatch.setattr(api, "_make_node", no_node)
    with caplog.at_level(logging.DEBUG, logger="swarm.api"), \
            pytest.raises(RuntimeError, match="no node"):
        api.local(0, data_dir=tmp_path)
    assert not caplog.records            # there was no node to stop: nothing to report
    assert list(tmp_path.iterdir()) == []


def test_a_node_that_cannot_be_stopped_is_logged_and_the_first_error_wins(
        monkeypatch, tmp_path, caplog):
    async def node(config, key):
        return _Node()

    monkeypatch.setattr(api, "_make_node", node)
    with caplog.at_level(logging.WARNING, logger="swarm.api"), \
            pytest.raises(RuntimeError, match="cannot start"):
        api.local(0, data_dir=tmp_path)
    assert any("cannot stop" in r.getMessage() for r in caplog.records)
    assert list(tmp_path.iterdir()) == []
