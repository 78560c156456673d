"""The project's own shape: what `pip install .` ships, what the README documents, what the layout allows.

- Every production package is listed for setuptools, with its non-Python files declared as package data,
  and every third-party module the production code imports is a declared dependency (a plain
  ``pip install .`` runs the demo; the test extras are not needed for it).
- Every setting is a described ``Settings`` field and appears in the README's table of settings.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

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


def test_every_production_package_is_shipped() -> None:
    assert set(production_packages()) <= set(SETUPTOOLS["packages"])
    assert set(SETUPTOOLS["py-modules"]) >= {"worker", "starter", "demo", "settings"}


def test_every_non_python_file_of_a_package_is_declared_package_data() -> None:
    declared = SETUPTOOLS["package-data"]
    missing = []
    for package in SETUPTOOLS["packages"]:
        for path in (ROOT / package).rglob("*"):
            if not path.is_file() or path.suffix in {".py", ".pyc"} or "__pycache__" in path.parts:
                continue
            relative = str(path.relative_to(ROOT / package))
            if not any(fnmatch.fnmatch(relative, pattern) for pattern in declared.get(package, [])):
                missing.append(f"{package}/{relative}")
    assert missing == []


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
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(EXPORTS_[A-Z0-9_]+)` \|", readme, re.MULTILINE))
    for name, field in Settings.model_fields.items():
        assert field.description, f"{name} has no description"
        assert f"EXPORTS_{name.upper()}" in documented, f"EXPORTS_{name.upper()} is not in the README's table"
    assert documented <= {f"EXPORTS_{n.upper()}" for n in Settings.model_fields}, (
        "the README lists unknown settings"
    )
