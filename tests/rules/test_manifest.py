"""What a manifest says and where it goes (issue #24.6, ``domain.manifest``): the coreutils sidecar line, the
canonical JSON manifest, their names beside the file, and that the content is a function of the row alone, so the
worker and recovery write the same bytes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from domain.manifest import (
    MANIFEST_CHOICES,
    ManifestFacts,
    json_content,
    manifest_names,
    manifests_for_job,
    manifests_in_place,
    sidecar_content,
)
from domain.models import ExportJob, JobStatus
from tests.rules.factories import job as make_job

FILE = "contacts-k-1.csv.gz.pgp"


def facts(**overrides: Any) -> ManifestFacts:
    values: dict[str, Any] = {
        "export_id": uuid.UUID("00000000-0000-4000-8000-000000000001"),
        "delivery_key": "k-1",
        "file": FILE,
        "size": 3,
        "sha256": hashlib.sha256(b"abc").digest(),
        "rows": 2,
        "created_at": datetime(2026, 5, 1, 12, 0, tzinfo=UTC),
    }
    values.update(overrides)
    return ManifestFacts(**values)


def test_the_sidecar_is_sha256sums_own_line_and_sha256sum_c_passes_on_it(tmp_path: Path) -> None:
    (tmp_path / FILE).write_bytes(b"abc")
    sidecar = sidecar_content(facts())
    assert sidecar == f"{hashlib.sha256(b'abc').hexdigest()}  {FILE}\n".encode()
    (tmp_path / f"{FILE}.sha256").write_bytes(sidecar)
    checked = subprocess.run(
        ["sha256sum", "-c", f"{FILE}.sha256"], cwd=tmp_path, capture_output=True, check=False
    )
    assert checked.returncode == 0 and checked.stdout == f"{FILE}: OK\n".encode()
    (tmp_path / FILE).write_bytes(b"abd")
    tampered = subprocess.run(
        ["sha256sum", "-c", f"{FILE}.sha256"], cwd=tmp_path, capture_output=True, check=False
    )
    assert tampered.returncode != 0


def test_the_json_manifest_holds_exactly_the_issues_fields_canonically() -> None:
    content = json_content(facts(created_at=datetime(2026, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))))
    assert content.endswith(b"\n") and b" " not in content
    assert json.loads(content) == {
        "export_id": "00000000-0000-4000-8000-000000000001",
        "delivery_key": "k-1",
        "file": FILE,
        "bytes": 3,
        "rows": 2,
        "sha256": hashlib.sha256(b"abc").hexdigest(),
        "created_at": "2026-05-01T12:00:00.000000+00:00",  # UTC, whatever zone it was read in
    }
    assert json_content(facts()) == content  # the same facts, the same bytes


@pytest.mark.parametrize(
    ("choice", "names"),
    [
        ("none", ()),
        (None, ()),
        ("sha256", (f"{FILE}.sha256",)),
        ("json", (f"{FILE}.manifest.json",)),
        ("both", (f"{FILE}.sha256", f"{FILE}.manifest.json")),
    ],
)
def test_each_choice_names_its_manifests_beside_the_file_sidecar_first(
    choice: str | None, names: tuple[str, ...]
) -> None:
    assert manifest_names(FILE, choice) == names
    assert choice is None or choice in MANIFEST_CHOICES


def job(**overrides: Any) -> ExportJob:
    fields: dict[str, Any] = {
        "delivery_key": "k-1",
        "expected_file_name": FILE,
        "expected_file_bytes": 3,
        "expected_file_sha256": hashlib.sha256(b"abc").digest(),
        "expected_file_rows": 2,
        "delivery_authorized_at": datetime(2026, 5, 1, 12, 0, tzinfo=UTC),
        "expected_manifest": "both",
    }
    fields.update(overrides)
    return make_job(JobStatus.DELIVERING, **fields)


def test_a_jobs_manifests_come_from_its_row_alone_and_none_before_cutoff_2() -> None:
    both = manifests_for_job(job())
    assert [(m.kind, m.name) for m in both] == [
        ("sha256", f"{FILE}.sha256"),
        ("json", f"{FILE}.manifest.json"),
    ]
    assert both[0].content == sidecar_content(facts())
    assert json.loads(both[1].content)["rows"] == 2
    assert manifests_for_job(job(expected_manifest="none")) == ()
    assert manifests_for_job(job(expected_file_sha256=None)) == ()  # cutoff 2 never recorded the file


def test_only_published_or_in_place_manifests_count_as_in_place() -> None:
    seen = [
        {"observation": "manifest", "name": "a.sha256", "result": "published"},
        {"observation": "manifest", "name": "a.manifest.json", "result": "conflict"},
        {"observation": "manifest", "name": "b.sha256", "result": "in_place"},
        {"observation": "rename", "name": "c.sha256", "result": "ok"},
        {"observation": "manifest", "name": "d.sha256", "result": "interrupted"},
    ]
    assert manifests_in_place(seen) == {"a.sha256", "b.sha256"}
