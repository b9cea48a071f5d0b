"""The CI hook of tests/conftest.py, on a tiny suite run by a real pytest subprocess: under CI a
skip for a missing component fails the run; a skip that says no install fixes it stays a skip."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ci_on, subprocess_env

SUITE = '''
import pytest

from tests.conftest import no_install_fixes

def test_missing_chromium():
    pytest.skip("chromium is not installed")

@pytest.fixture
def netns():
    pytest.skip("network namespaces need root")

def test_in_a_namespace(netns):
    pass

@pytest.mark.skipif(True, reason="this kernel has no IPv6 loopback")
def test_ipv6():
    pass

def test_netem():
    pytest.skip(no_install_fixes("tc netem is not supported by this kernel"))

@pytest.mark.skipif(True, reason=no_install_fixes("a HID device is present here"))
def test_no_key():
    pass

def test_runs():
    pass
'''


GONE = ('import pytest\n\nlt = pytest.importorskip("no_such_module_anywhere")\n\n\n'
        "def test_uses_it():\n    pass\n")


def _run(tmp_path, ci: str | None, **files: str) -> tuple[int, str]:
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = subprocess_env(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")  # only the hook under test
    env.pop("CI", None)
    if ci is not None:
        env["CI"] = ci
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p",
                          "no:cacheprovider", "-q", "-rA", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    return res.returncode, res.stdout + res.stderr


def test_under_ci_a_missing_component_fails_and_a_machine_fact_stays_a_skip(tmp_path):
    rc, out = _run(tmp_path, "true", test_tiny=SUITE)
    assert rc == 1, out
    assert "1 failed, 1 passed, 2 skipped, 2 errors" in out, out  # errors: skips in setup
    for why in ("chromium is not installed", "network namespaces need root",
                "this kernel has no IPv6 loopback"):
        assert f"CI must run this, but it was skipped: {why}" in out, (why, out)
    assert "a HID device is present here (no install fixes this)" in out, out
    assert "tc netem is not supported by this kernel (no install fixes this)" in out, out


def test_under_ci_a_module_skipped_for_a_missing_import_fails(tmp_path):
    rc, out = _run(tmp_path, "Yes", test_gone=GONE)
    assert rc == 2, out                 # a collection error: pytest stops, the run fails
    assert ("CI must run this, but it was skipped: could not import "
            "'no_such_module_anywhere'") in out, out


def test_outside_ci_every_skip_stays_a_skip(tmp_path):
    rc, out = _run(tmp_path, "false", test_tiny=SUITE, test_gone=GONE)
    assert rc == 0, out
    assert "1 passed, 6 skipped" in out and "failed" not in out, out


def test_ci_spellings():
    assert all(ci_on({"CI": v}) for v in ("1", "true", "True", "YES", " true\n"))
    assert not any(ci_on(e) for e in ({}, {"CI": ""}, {"CI": "0"}, {"CI": "false"},
                                      {"CI": "no"}))
