"""Fuzzing of the parsers not fuzzed elsewhere (URIs, wire, DHT RPC, statements, member
records and control envelopes have their own property tests): the .npy files `swarm submit`
reads, and the coordinator state file a node reads back from its data dir. Every input is
either accepted as what it claims to be or refused with the project's own error.

A longer run: ``SWARM_FUZZ_EXAMPLES=5000 python -m pytest tests/test_proof_fuzz.py``."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm.commands.submit import _load
from swarm.control.state import CoordinatorState, load_state, save_state, state_path
from swarm.errors import ConfigError
from swarm.runtime.actors import method_spec
from tests.conftest import DEAD, run_swarm

SETTINGS = settings(max_examples=int(os.environ.get("SWARM_FUZZ_EXAMPLES", "150")), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


VALID = _npy(np.arange(12, dtype=np.float32).reshape(3, 4))


def _accepts(path: Path) -> None:
    """What `swarm submit` does with one input: load, then the matmul check."""
    try:
        arr = _load(path, "A")
    except ConfigError:
        return
    try:
        method_spec("matmul", "matmul").check([arr, np.ones((arr.shape[-1:] or (1,))[0:1]
                                                             * 2, np.float32)], {})
    except (TypeError, ValueError):
        return


@SETTINGS
@given(cut=st.integers(0, len(VALID) - 1), flips=st.lists(
    st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=8))
def test_mutated_npy_files_are_loaded_or_refused(tmp_path, cut, flips):
    data = bytearray(VALID)
    for at, byte in flips:
        data[at] = byte
    path = tmp_path / "a.npy"
    path.write_bytes(bytes(data[:cut] if cut else data))
    _accepts(path)  # raises only on an escaped exception (the bug this test hunts)


def test_garbled_header_regression(tmp_path):
    """Found by the test above: a NUL in the header dict made np.load raise
    tokenize.TokenError, which escaped `swarm submit` as a traceback."""
    data = bytearray(VALID)
    data[10] = 0
    (tmp_path / "a.npy").write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="not a plain .npy array"):
        _load(tmp_path / "a.npy", "A")


@SETTINGS
@given(blob=st.binary(max_size=300))
def test_random_bytes_as_npy(tmp_path, blob):
    path = tmp_path / "a.npy"
    path.write_bytes(b"\x93NUMPY" + blob)
    _accepts(path)


class _Boom:
    def __reduce__(self):
        return (Path.touch, (Path(_Boom.target),))

    target = ""


def test_pickled_object_array_is_refused_and_never_unpickled(tmp_path):
    _Boom.target = str(tmp_path / "pwned")
    arr = np.array([_Boom(), 1], dtype=object)
    with (tmp_path / "a.npy").open("wb") as f:
        np.save(f, arr, allow_pickle=True)
    np.save(tmp_path / "b.npy", np.ones((2, 2), np.float32))
    res = run_swarm("submit", DEAD, "--swarm", "00" * 20, "matmul",
                    str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "-o",
                    str(tmp_path / "c.npy"), timeout=60)
    assert res.returncode == 2 and "not a plain .npy array" in res.stderr
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("arr, why", [
    (np.ones((4, 4), np.int64), "float"),
    (np.ones((4, 4), np.complex64), "float"),
    (np.ones((4,), np.float32), "2"),
    (np.ones((2, 2, 2), np.float32), "2"),
])
def test_wrong_dtype_or_rank_is_a_usage_error(tmp_path, arr, why):
    np.save(tmp_path / "a.npy", arr)
    np.save(tmp_path / "b.npy", np.ones((4, 4), np.float32))
    res = run_swarm("submit", DEAD, "--swarm", "00" * 20, "matmul",
                    str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "-o",
                    str(tmp_path / "c.npy"), timeout=60)
    assert res.returncode == 2, res.stderr
    assert "cannot multiply" in res.stderr and why in res.stderr


def test_truncated_npy_is_a_usage_error(tmp_path):
    (tmp_path / "a.npy").write_bytes(VALID[: len(VALID) // 2])
    np.save(tmp_path / "b.npy", np.ones((4, 4), np.float32))
    res = run_swarm("submit", DEAD, "--swarm", "00" * 20, "matmul",
                    str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "-o",
                    str(tmp_path / "c.npy"), timeout=60)
    assert res.returncode == 2 and "A:" in res.stderr, res.stderr


SWARM = b"\x01" * 20


@SETTINGS
@given(text=st.one_of(st.text(max_size=200), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
        st.sampled_from(["v", "sw", "t", "q", "c", "p", "pr", "b", "a", "x"]), kids,
        max_size=9), max_leaves=20).map(json.dumps)))
def test_state_file_garbage_is_ignored(tmp_path, text):
    path = state_path(tmp_path, SWARM)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    # No text here can decode to a state of SWARM (its "sw" would need the 40 hex digits of
    # SWARM), so every file is garbage and is ignored: no state at all, not a made-up one.
    assert load_state(tmp_path, SWARM) is None


def test_state_file_roundtrip_and_other_swarm(tmp_path):
    from identity import PeerKey

    st0 = CoordinatorState(swarm=SWARM, term=3, seq=1, coordinator=PeerKey.generate().peer_id)
    save_state(tmp_path, st0)
    assert load_state(tmp_path, SWARM) == st0
    assert load_state(tmp_path, b"\x02" * 20) is None
