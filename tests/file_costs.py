"""The order `make test` hands test files to its xdist workers: longest first.

`make test` runs three workers that each take the next whole file (``--dist loadfile``). A
long file that starts last runs alone at the end while the others idle; handing them out
longest first (LPT scheduling) lets them end together, the short files filling the gaps.
xdist's own order (files with the most tests first) is turned off in tests/conftest.py: it
started the one-test, 50 s files last.

``FILE_SECONDS`` holds each file's wall time, rounded, in one CI run on 2 overloaded cores
(2026-12-08, 31 min in all; only the order they give matters), for the files of 5 s or more
and every file with a ``system`` or ``slow`` test. It orders, it limits nothing;
tests/test_file_costs.py fails when a listed file is gone or a file with a ``system`` or
``slow`` test is missing. To refresh it from a run::

    python -m pytest -n 2 --dist loadfile --durations=0 | python -m tests.file_costs
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FILE_SECONDS: dict[str, int] = {
    "tests/system/test_browser.py": 420,
    "tests/system/test_nat_swarm.py": 212,
    "tests/test_control_system.py": 161,
    "tests/test_runtime_untrusted_cli.py": 138,
    "tests/test_dht_network.py": 127,
    "tests/test_dht_readonly.py": 20,
    "tests/test_control_core.py": 122,
    "tests/test_models_quant.py": 122,
    "tests/test_newcomer.py": 101,
    "tests/system/test_faults.py": 96,
    "tests/test_spans_faults.py": 90,
    "tests/test_models_ops.py": 88,
    "tests/test_spans.py": 86,
    "tests/test_control_cli_attacks.py": 84,
    "tests/test_control_rejoin.py": 80,
    "tests/test_scale_sim.py": 67,
    "tests/system/test_partition.py": 65,
    "tests/test_runtime_local.py": 65,
    "tests/test_training_swarm.py": 60,
    "tests/test_chat_http.py": 58,
    "tests/test_model_serving.py": 58,
    "tests/test_runtime_api.py": 58,
    "tests/test_cli_generate.py": 50,
    "tests/test_compute_bench.py": 44,
    "tests/test_embed_swarm.py": 44,
    "tests/system/test_dht_libtorrent.py": 39,
    "tests/test_cli_json.py": 39,
    "tests/test_runtime_memory.py": 39,
    "tests/test_spans_placement.py": 39,
    "tests/test_embed_cli.py": 38,
    "tests/test_embed_http.py": 37,
    "tests/test_control_demo.py": 35,
    "tests/test_embed_untrusted.py": 35,
    "tests/test_minilm_span.py": 32,
    "tests/test_cli_bad_input.py": 30,
    "tests/test_records.py": 29,
    "tests/test_runtime_untrusted.py": 29,
    "tests/test_identity_statements.py": 27,
    "tests/test_training_cli.py": 27,
    "tests/test_runtime_submit.py": 26,
    "tests/test_layout.py": 25,
    "tests/test_links_shm.py": 24,
    "tests/test_links_webrtc.py": 24,
    "tests/test_dht_cli.py": 23,
    "tests/test_cli_doctor.py": 22,
    "tests/system/test_nat_webrtc.py": 20,
    "tests/test_proof_fuzz.py": 20,
    "tests/test_batching.py": 19,
    "tests/test_compute_verify.py": 18,
    "tests/test_dht_fuzz.py": 16,
    "tests/test_bench_scale.py": 15,
    "tests/test_generate.py": 15,
    "tests/system/test_nat_testbed.py": 14,
    "tests/test_model_registry.py": 14,
    "tests/test_control_failover.py": 13,
    "tests/test_control_uri.py": 13,
    "tests/test_training_core.py": 13,
    "tests/test_control_jobs.py": 11,
    "tests/test_models_minilm.py": 10,
    "tests/test_placement.py": 10,
    "tests/system/test_hosts.py": 9,
    "tests/test_llama.py": 9,
    "tests/test_links_tls.py": 8,
    "tests/test_runtime_host.py": 8,
    "tests/system/test_dht_bep42.py": 7,
    "tests/test_control_unit.py": 7,
    "tests/test_compute_shards.py": 5,
    "tests/test_identity_chain.py": 5,
    "tests/test_links_reach_node.py": 5,
    "tests/test_dht_mainline.py": 4,
    "tests/system/test_soak_short.py": 0,  # soak only (make soak)
}
"""Seconds of wall time per test file (path from the repository root); a file not listed
counts as 0 and keeps its collection order after the listed ones."""


def seconds(path: Path) -> int:
    """The estimate for the test file at ``path`` (0 when not listed)."""
    try:
        key = path.resolve().relative_to(ROOT).as_posix()
    except ValueError:  # a file outside this tree (a test's own tiny suite)
        return 0
    return FILE_SECONDS.get(key, 0)


def longest_first(items: list) -> None:
    """Sort collected items in place: files by estimate, longest first; ties, the unlisted
    files and the tests inside each file keep their collection order (both workers must
    collect the same order, and a module's tests run in the order written)."""
    first: dict[Path, int] = {}
    cost: dict[Path, int] = {}
    for i, item in enumerate(items):
        if item.path not in first:
            first[item.path] = i
            cost[item.path] = seconds(item.path)
    items.sort(key=lambda item: (-cost[item.path], first[item.path]))


_DURATION = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+?\.py)::")


def table(lines) -> dict[str, int]:
    """Seconds per file from pytest's ``--durations=0`` lines (setup, call and teardown)."""
    total: dict[str, float] = defaultdict(float)
    for line in lines:
        if m := _DURATION.match(line):
            total[m[2]] += float(m[1])
    return {f: round(s) for f, s in sorted(total.items(), key=lambda kv: -kv[1]) if s >= 1}


if __name__ == "__main__":
    for path, secs in table(sys.stdin).items():
        print(f'    "{path}": {secs},')
