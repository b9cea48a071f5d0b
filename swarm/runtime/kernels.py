"""User WGSL kernels run where they can be stopped: a child process that owns its own device.

A kernel with an endless loop passes validation and would block a worker's compute thread
(and its GPU queue) forever. :class:`KernelRunner` keeps one child process
(``python -m swarm.runtime.kernels``) that creates its own wgpu device and runs one dispatch
at a time; each dispatch has a time limit, and a dispatch past it is answered with
:class:`KernelTimeout` and the child is killed (the next kernel starts a fresh one). Device
start-up has its own, longer limit and does not count against the dispatch.

The pipe carries length-prefixed msgpack frames (arrays as dtype, shape, bytes): no pickle,
even between parent and child.
"""

from __future__ import annotations

import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

KERNEL_TIME_LIMIT = 60.0
"""Default seconds one kernel dispatch may run."""
START_LIMIT = 120.0
"""Seconds the child may take to start and open its device."""
MAX_CHILD_FRAME = 1 << 31
"""Largest frame between the worker and its kernel child process (a local pipe, not the
wire: :data:`swarm.wire.MAX_FRAME` bounds what peers send)."""


class KernelTimeout(Exception):
    """A kernel dispatch ran past its time limit and was stopped."""


class KernelFailed(RuntimeError):
    """The kernel was refused or failed in the child (the message says why)."""


def _pack_array(x: np.ndarray) -> list:
    x = np.ascontiguousarray(x)
    return [x.dtype.str, list(x.shape), x.tobytes()]


def _unpack_array(o: Any) -> np.ndarray:
    dtype, shape, data = o
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()


def _write(fd: int, obj: Any) -> None:
    data = msgpack.packb(obj, use_bin_type=True)
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    out = bytearray()
    while len(out) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise KernelTimeout("no answer in time")
        chunk = os.read(fd, min(n - len(out), 1 << 20))
        if not chunk:
            raise EOFError("kernel process closed its pipe")
        out += chunk
    return bytes(out)


def _read(fd: int, deadline: float | None = None) -> Any:
    (n,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if n > MAX_CHILD_FRAME:
        raise EOFError(f"frame of {n} bytes")
    return msgpack.unpackb(_read_exact(fd, n, deadline), raw=False)


class KernelRunner:
    """Runs WGSL kernels in a child process under a per-dispatch time limit."""

    def __init__(self, time_limit: float = KERNEL_TIME_LIMIT) -> None:
        if not time_limit > 0:
            raise ValueError("the kernel time limit must be positive seconds")
        self.time_limit = time_limit
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.timeouts = 0
        """Dispatches stopped at the limit (for status and tests)."""

    def run(self, wgsl: str, inputs: dict[str, np.ndarray],
            outputs: dict[str, tuple[tuple[int, ...], Any]], dispatch: tuple[int, int, int],
            *, hang: bool = False) -> dict[str, np.ndarray]:
        """Run one kernel (``compute``'s ``run_kernel`` arguments); ``hang`` makes the child
        never finish (``SWARM_CHAOS=hang``). Raises :class:`KernelTimeout` past the limit."""
        job = {"wgsl": wgsl, "inputs": {k: _pack_array(v) for k, v in inputs.items()},
               "outputs": {k: [list(shape), np.dtype(dt).str]
                           for k, (shape, dt) in outputs.items()},
               "dispatch": list(dispatch), "hang": hang}
        with self._lock:
            proc = self._start()
            try:
                _write(proc.stdin.fileno(), job)
                reply = _read(proc.stdout.fileno(), time.monotonic() + self.time_limit)
            except KernelTimeout:
                self.timeouts += 1
                self._stop()
                raise KernelTimeout(f"the kernel ran past its {self.time_limit:g} s limit "
                                    "and was stopped") from None
            except (EOFError, OSError) as exc:
                self._stop()
                raise KernelFailed(f"the kernel process died: {exc}") from None
        if "error" in reply:
            raise KernelFailed(reply["error"])
        return {k: _unpack_array(v) for k, v in reply["outputs"].items()}

    def _start(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        here = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("SWARM_CHAOS", None)
        # -P: this tree (PYTHONPATH), not a `swarm` in the working directory
        proc = subprocess.Popen([sys.executable, "-P", "-m", "swarm.runtime.kernels"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env)
        self._proc = proc
        try:
            ready = _read(proc.stdout.fileno(), time.monotonic() + START_LIMIT)
        except (KernelTimeout, EOFError, OSError) as exc:
            self._stop()
            raise KernelFailed(f"the kernel process did not start: {exc}") from None
        if "error" in ready:
            self._stop()
            raise KernelFailed(ready["error"])
        return proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def close(self) -> None:
        """Kill the child now (a dispatch in flight then fails)."""
        self._stop()


def _child() -> int:
    """The child: open a device, then run one kernel per frame until stdin closes."""
    fd_in, fd_out = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt frames
    try:
        import compute

        backend = compute.get_backend("wgpu")
    except Exception as exc:  # no device here: every kernel is refused with the reason
        _write(fd_out, {"error": f"no wgpu device for kernels: {exc}"})
        return 1
    _write(fd_out, {"ready": True})
    while True:
        try:
            job = _read(fd_in)
        except EOFError:
            return 0
        if job.get("hang"):
            while True:  # what an endless kernel does to the thread that waits for it
                time.sleep(3600)
        try:
            outs = backend.run_kernel(
                job["wgsl"], inputs={k: _unpack_array(v) for k, v in job["inputs"].items()},
                outputs={k: (tuple(shape), np.dtype(dt))
                         for k, (shape, dt) in job["outputs"].items()},
                dispatch=tuple(job["dispatch"]))
            _write(fd_out, {"outputs": {k: _pack_array(v) for k, v in outs.items()}})
        except Exception as exc:  # refused or failed: the parent reports it
            _write(fd_out, {"error": f"{type(exc).__name__}: {str(exc)[:500]}"})


if __name__ == "__main__":
    sys.exit(_child())
