"""The project's own shape: what `pip install .` ships, what the README documents, what the layout allows.

- Every production package is listed for setuptools, with its non-Python files declared as package data,
  and every third-party module the production code imports is a declared dependency (a plain
  ``pip install .`` runs the demo; the test extras are not needed for it).
- Every setting is a described ``Settings`` field and appears in the table of settings (docs/operations.md).
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from settings import Settings

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
NOT_SHIPPED = {"tests", "bench", "chaos", "build", "testbed"}  # testbed: real servers for tests only


def production_packages() -> list[str]:
    return sorted(
        p.parent.name
        for p in ROOT.glob("*/__init__.py")
        if p.parent.name not in NOT_SHIPPED and not p.parent.name.startswith(".")
    )


def _data_folders(package: str) -> set[str]:
    """The folders under a package that hold files but no Python: setuptools ships them as packages."""
    top = ROOT / package
    return {
        ".".join(folder.relative_to(ROOT).parts)
        for folder in [top, *top.rglob("*")]
        if folder.is_dir()
        and folder.name != "__pycache__"
        and any(f.is_file() for f in folder.iterdir())
        and not (folder / "__init__.py").exists()
    }


def test_every_production_package_is_shipped() -> None:
    assert set(production_packages()) <= set(SETUPTOOLS["packages"])
    assert set(SETUPTOOLS["py-modules"]) >= {"worker", "starter", "demo", "settings"}
    folders = {f for package in production_packages() for f in _data_folders(package)}
    assert folders <= set(SETUPTOOLS["packages"]), "a folder of data files is not listed as a package"


def _owner(path: Path) -> str:
    """The deepest listed package that holds ``path``."""
    parts = path.relative_to(ROOT).parts[:-1]
    for depth in range(len(parts), 0, -1):
        if ".".join(parts[:depth]) in SETUPTOOLS["packages"]:
            return ".".join(parts[:depth])
    raise AssertionError(f"{path} is in no listed package")


def shipped_data_files() -> list[Path]:
    return sorted(
        path
        for package in SETUPTOOLS["packages"]
        if "." not in package
        for path in (ROOT / package).rglob("*")
        if path.is_file() and path.suffix not in {".py", ".pyc"} and "__pycache__" not in path.parts
    )


def test_every_non_python_file_of_a_package_is_declared_package_data() -> None:
    declared = SETUPTOOLS["package-data"]
    missing = []
    for path in shipped_data_files():
        owner = _owner(path)
        relative = str(path.relative_to(ROOT / owner.replace(".", "/")))
        if not any(fnmatch.fnmatch(relative, pattern) for pattern in declared.get(owner, [])):
            missing.append(str(path.relative_to(ROOT)))
    assert missing == []


@pytest.mark.slow
def test_the_wheel_builds_without_warnings_and_ships_every_data_file(tmp_path: Path) -> None:
    # Built from a copy of the tracked files, so the work tree gets no build/ or egg-info.
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout.split("\0")
    source = tmp_path / "src"
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    output = built.stdout + built.stderr
    assert re.findall(r"\w*(?:BuildBackend|Setuptools\w*)Warning.*", output) == []
    [wheel] = tmp_path.glob("fenced_exports-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    expected = {str(path.relative_to(ROOT)) for path in shipped_data_files()}
    expected |= {f"{module}.py" for module in SETUPTOOLS["py-modules"]}
    assert expected - names == set()
    assert not any(name.startswith(tuple(f"{p}/" for p in NOT_SHIPPED)) for name in names)


def _imported_top_levels(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def test_every_third_party_module_the_shipped_code_imports_is_a_declared_dependency() -> None:
    shipped = [p for package in SETUPTOOLS["packages"] for p in (ROOT / package).rglob("*.py")]
    shipped += [ROOT / f"{module}.py" for module in SETUPTOOLS["py-modules"]]
    ours = set(SETUPTOOLS["packages"]) | set(SETUPTOOLS["py-modules"])
    third_party = _imported_top_levels(shipped) - ours - set(sys.stdlib_module_names) - {"__future__"}
    declared = {
        re.split(r"[<>=\[ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        for requirement in PYPROJECT["project"]["dependencies"]
    }
    distributions = importlib.metadata.packages_distributions()
    undeclared = {
        module: distributions.get(module)
        for module in sorted(third_party)
        if not any(d.lower().replace("_", "-") in declared for d in distributions.get(module, []))
    }
    # testbed/ may use what only the tests install (testcontainers, pytest): it is not imported by the demo.
    undeclared = {m: d for m, d in undeclared.items() if m not in {"testcontainers", "docker", "pytest"}}
    assert undeclared == {}


def test_every_setting_is_described_and_in_the_readme_table() -> None:
    # The table of settings moved from the README to docs/operations.md ("Configuration").
    readme = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(EXPORTS_[A-Z0-9_]+)` \|", readme, re.MULTILINE))
    for name, field in Settings.model_fields.items():
        assert field.description, f"{name} has no description"
        assert f"EXPORTS_{name.upper()}" in documented, (
            f"EXPORTS_{name.upper()} is not in docs/operations.md's table"
        )
    assert documented <= {f"EXPORTS_{n.upper()}" for n in Settings.model_fields}, (
        "docs/operations.md lists unknown settings"
    )
