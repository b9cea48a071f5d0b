"""Probe, benchmark and `swarm bench`: measured figures, the JSON shape, refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from compute import BackendUnavailable, InvalidInput, registry
from compute.bench import benchmark, measured_tflops, require_backend
from compute.numpy_backend import NumpyBackend
from compute.probe import probe
from swarm import cli
from tests.conftest import run_swarm


@pytest.fixture(autouse=True)
def fresh_registry():
    registry.clear_cache()
    yield
    registry.clear_cache()


def test_probe_reports_host_and_adapters():
    info = probe()
    assert info["host"]["cpus"] >= 1 and info["host"]["memory_bytes"] > 0
    for adapter in info["adapters"]:
        assert adapter["name"] and adapter["type"] and adapter["api"]
        assert isinstance(adapter["shader_f16"], bool)
        assert adapter["limits"]["max-storage-buffer-binding-size"] > 0
    if not info["adapters"]:
        assert info["adapters_reason"]


def test_quick_benchmark_measures_every_validated_backend():
    result = benchmark(quick=True)
    rows = {r["name"]: r for r in result["backends"]}
    # the smallest size always; a larger one only when the ~3 s budget covers it (a loaded
    # machine's 256 may predict 512 past it: CI with other tests beside it measured only 256)
    assert rows["numpy"]["validated"] and list(rows["numpy"]["gflops"]) in (["256"],
                                                                            ["256", "512"])
    assert all(g > 0 for r in rows.values() for g in r["gflops"].values())
    best = max(g for r in rows.values() for g in r["gflops"].values())
    assert result["tflops"] == pytest.approx(best / 1000) == measured_tflops(result)
    assert result["best"]["gflops"] == pytest.approx(best)
    if rows["wgpu"]["validated"]:
        kernel = result["kernel"]
        assert kernel["n"] == 256 and kernel["naive_gflops"] > 0 and kernel["tiled_gflops"] > 0
        assert kernel["adapter"] == rows["wgpu"]["adapter"]["name"]
    else:
        assert rows["wgpu"]["reason"] and result["kernel"] is None


def test_benchmark_respects_the_time_budget():
    result = benchmark((64, 128, 4096, 8192), 0.5, backends=["numpy"])
    (row,) = result["backends"]
    assert "64" in row["gflops"] and "8192" not in row["gflops"]
    assert result["elapsed_s"] < 10


def test_benchmark_refuses_bad_arguments():
    with pytest.raises(InvalidInput):
        benchmark((0,))
    with pytest.raises(InvalidInput):
        benchmark((64,), 0)


def test_measured_tflops_counts_validated_backends_only():
    result = {"backends": [
        {"name": "a", "validated": False, "gflops": {"64": 5000.0}},
        {"name": "b", "validated": True, "gflops": {"64": 10.0, "128": 30.0}},
    ]}
    assert measured_tflops(result) == pytest.approx(0.03)
    nothing = {"backends": [{"name": "a", "validated": False, "reason": "broken", "gflops": {}}]}
    assert measured_tflops(nothing) == 0
    with pytest.raises(BackendUnavailable, match="a: broken"):
        require_backend(nothing)


def test_swarm_bench_json_quick(home):
    res = run_swarm("bench", "--data-dir", str(home), "--json", "--quick", timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    for row in out["backends"]:
        assert {"name", "validated", "reason", "adapter", "gflops"} <= set(row)
    rows = {r["name"]: r for r in out["backends"]}
    assert rows["numpy"]["validated"] and rows["numpy"]["gflops"]["256"] > 0
    # The subprocess must be able to load wgpu after the CLI configured logging.
    assert rows["wgpu"]["validated"] or "cannot load" not in (rows["wgpu"]["reason"] or "")
    if rows["wgpu"]["validated"]:
        assert {"naive_gflops", "tiled_gflops", "n"} <= set(out["kernel"])
    assert out["tflops"] > 0


def test_swarm_bench_table_and_usage_errors(home):
    res = run_swarm("bench", "--data-dir", str(home), "--backend", "numpy", "--sizes", "32,64",
                    "--budget", "2")
    assert res.returncode == 0, res.stderr
    assert "numpy" in res.stdout and "n=64" in res.stdout and "announced throughput" in res.stdout
    bad = run_swarm("bench", "--data-dir", str(home), "--sizes", "0")
    assert bad.returncode == cli.EXIT_USAGE


class Zeros(NumpyBackend):
    name = "numpy"

    def matmul(self, a, b, precision="f32"):
        return np.zeros((np.shape(a)[0], np.shape(b)[1]), np.float32)


def test_swarm_bench_lists_refused_backends(monkeypatch, capsys, home):
    monkeypatch.setattr(registry, "FACTORIES", {"zeros": lambda t: Zeros(t),
                                                "numpy": registry.FACTORIES["numpy"]})
    assert cli.main(["bench", "--data-dir", str(home), "--json", "--sizes", "32"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["backends"]}
    assert not rows["zeros"]["validated"] and "all zeros" in rows["zeros"]["reason"]
    assert rows["zeros"]["gflops"] == {} and rows["numpy"]["gflops"]["32"] > 0


def test_swarm_bench_without_any_backend_is_unavailable(monkeypatch, capsys, home):
    monkeypatch.setattr(registry, "FACTORIES", {"zeros": lambda t: Zeros(t)})
    assert cli.main(["bench", "--data-dir", str(home), "--sizes", "32"]) == cli.EXIT_UNAVAILABLE
    assert "no usable compute backend" in capsys.readouterr().err


def _script(name: str, *args: str, timeout: float = 120):
    import subprocess
    import sys

    from tests.conftest import ROOT, subprocess_env

    return subprocess.run([sys.executable, str(ROOT / "bench" / name), *args],
                          capture_output=True, text=True, timeout=timeout, env=subprocess_env())


def test_gpu_matmul_script_explains_what_is_missing():
    import importlib.util

    res = _script("gpu_matmul.py")
    if importlib.util.find_spec("torch") is None:
        assert res.returncode == 4 and "torch is not installed" in res.stderr
    cpu_only = _script("gpu_matmul.py", "--wgsl-only")
    if cpu_only.returncode == 4:
        assert "not a discrete GPU" in cpu_only.stderr or "no wgpu device" in cpu_only.stderr


def test_gpu_matmul_script_smoke_on_any_adapter():
    res = _script("gpu_matmul.py", "--wgsl-only", "--allow-cpu", "--sizes", "64", "--repeats",
                  "1", "--json")
    if res.returncode == 4:
        pytest.skip(res.stderr)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["freivalds_ok"] and out["sizes"]["64"]["wgsl_best"]["tflops"] > 0


def test_bench_compute_script_quick_json():
    res = _script("compute.py", "--quick", "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert all(r["accepts_correct"] and r["rejects_1pct"] for r in out["freivalds"])
    assert out["honesty"] and not any(r["false_rejections"] for r in out["honesty"])
    assert {r["n"] for r in out["numpy_overhead"]} == {256, 512}
    assert all("speedup" in r or "error" in r for r in out["kernels"])


def test_numpy_only_bench_never_touches_wgpu(tmp_path):
    """llvmpipe's wgpu can abort the whole process (SIGABRT in wgpuDevicePoll): a run
    restricted to numpy must not import wgpu at all, neither `swarm bench --backend numpy`
    nor the benchmark a `--backend numpy` worker runs at start-up."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from swarm import cli\n"
        "import compute\n"
        f"rc = cli.main(['bench', '--data-dir', {str(tmp_path)!r}, '--backend', 'numpy',\n"
        "               '--sizes', '32', '--budget', '1', '--json'])\n"
        "assert rc == 0, rc\n"
        "compute.get_backend('numpy')\n"
        "compute.benchmark([32], 1.0, backends=['numpy'])\n"
        "print('WGPU-LOADED' if 'wgpu' in sys.modules else 'WGPU-ABSENT')\n"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("WGPU-ABSENT"), res.stdout[-300:]
