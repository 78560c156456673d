"""What ``configure_process`` does to a process besides logs, traces and metrics: the garbage collector's
young-generation threshold (``EXPORTS_GC_THRESHOLD``). Each case runs in a process of its own, as
``main()`` of worker.py, ``starter.py serve`` and the demo call it, so the interpreter's setting is not
shared with the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import gc, json; default = gc.get_threshold();"
    "from settings import Settings; from observability.setup import configure_process;"
    "configure_process(Settings(), 'worker');"
    "print(json.dumps({'default': default, 'now': gc.get_threshold()}))"
)


def thresholds(env: dict[str, str]) -> dict[str, list[int]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("EXPORTS_", "OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_the_young_generation_is_collected_every_10000_allocations_by_default():
    seen = thresholds({})
    assert seen["default"][0] == 700  # the interpreter's, before
    assert seen["now"] == [10_000, *seen["default"][1:]]  # the older generations' thresholds kept


def test_the_threshold_is_a_setting_and_zero_keeps_the_interpreters():
    assert thresholds({"EXPORTS_GC_THRESHOLD": "50000"})["now"][0] == 50_000
    seen = thresholds({"EXPORTS_GC_THRESHOLD": "0"})
    assert seen["now"] == seen["default"]


def test_a_negative_threshold_is_refused_with_the_settings_name(monkeypatch):
    monkeypatch.setenv("EXPORTS_GC_THRESHOLD", "-1")
    with pytest.raises(ValidationError, match="gc_threshold"):
        Settings()
