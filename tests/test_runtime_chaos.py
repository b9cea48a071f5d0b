"""SWARM_CHAOS parsing and fault dice."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarm.errors import ConfigError
from swarm.runtime.chaos import Chaos, ChaosSpec, parse


def test_parse_all_keys():
    spec = parse("corrupt=0.5, drop=0.1,invalid=0.2,hang=0.3,delay=200,crash_after=3,seed=7")
    assert spec == ChaosSpec(corrupt=0.5, drop=0.1, invalid=0.2, hang=0.3, delay_ms=200,
                             crash_after=3, seed=7)
    assert parse("invalid=1").active and parse("hang=1").active
    assert parse("") == ChaosSpec() and not parse(None).active


@pytest.mark.parametrize("bad", ["corrupt", "corrupt=2", "drop=-0.1", "invalid=1.5", "hang=x", "delay=x", "crash_after=1.5",
                                 "explode=1", "seed=-1"])
def test_bad_values_are_config_errors(bad):
    with pytest.raises(ConfigError, match="SWARM_CHAOS"):
        parse(bad)


def test_hold_names_an_existing_directory(tmp_path):
    spec = parse(f"hold={tmp_path}")
    assert spec.hold == str(tmp_path) and spec.active
    assert Chaos(spec).next_task().hold == str(tmp_path)
    with pytest.raises(ConfigError, match="not a directory"):
        parse(f"hold={tmp_path / 'missing'}")


async def test_a_held_task_waits_for_the_release_file(tmp_path):
    import asyncio

    from swarm.runtime.chaos import hold

    held = asyncio.ensure_future(hold(str(tmp_path), 7))
    async with asyncio.timeout(10):
        while not (tmp_path / "held-7").exists():
            await asyncio.sleep(0.01)
    assert not held.done()
    (tmp_path / "release").touch()
    await asyncio.wait_for(held, 10)


@given(st.text(max_size=40))
def test_parser_never_crashes(text):
    try:
        parse(text)
    except ConfigError:
        pass


def test_crash_after_and_corrupt():
    c = Chaos(parse("crash_after=2,corrupt=1,seed=1"))
    assert c.next_task().corrupt and not c.next_task().crash
    assert c.next_task().crash
    a = np.ones((3, 3), np.float32)
    bad = c.corrupt(a)
    assert (bad != a).sum() == 1 and (a == 1).all()
