"""The image, as far as this machine can go without a container engine: the Dockerfile's shape (multi-stage,
non-root, nothing built or installed in the final stage), a build context that holds what it copies, and
its commands run in the venv exactly as the image runs them, from a directory holding exactly what the
image's /app holds: the worker's and the starter's --help, ``starter.py migrate`` against a real
database, and the HEALTHCHECK against the API started with deploy/compose.yaml's command.

the same HEALTHCHECK against the worker started with the image's CMD against a real database and the Temporal
dev server, and its drain on SIGTERM.

Not checked here: building the image, the base image's packages.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml

from db.embedded import free_port
from settings import Settings
from testbed import pg
from tests.ops.dockerfile import (
    Instruction,
    copy_sources,
    dockerignore_excludes,
    dockerignore_patterns,
    env_of,
    exec_form,
    final_stage,
    healthcheck_command,
    parse_dockerfile,
)

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTIONS = parse_dockerfile(ROOT / "Dockerfile")
FINAL = final_stage(INSTRUCTIONS)
# Every package and module pip ships, but the test servers and the demo (the image runs neither).
_SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
OUR_PACKAGES = tuple(
    name for name in [*_SETUPTOOLS["packages"], *_SETUPTOOLS["py-modules"]] if name not in ("testbed", "demo")
)


def last(keyword: str, instructions: list[Instruction] = FINAL) -> Instruction:
    found = [i for i in instructions if i.keyword == keyword]
    assert found, f"no {keyword} in the final stage"
    return found[-1]


def compose_command(service: str) -> list[str]:
    return yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"][service]["command"]


@pytest.fixture(scope="module")
def app_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the image's WORKDIR holds: exactly the final stage's COPY sources, nothing else."""
    app = tmp_path_factory.mktemp("image") / "app"
    app.mkdir()
    for instruction in FINAL:
        if instruction.keyword != "COPY" or "--from=" in instruction.args:
            continue
        for source in copy_sources(instruction):
            src = ROOT / source
            if src.is_dir():
                shutil.copytree(src, app / source.rstrip("/"), ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, app / source)
    return app


def image_env(**extra: str) -> dict[str, str]:
    """This process's environment with the image's ENV on top; PATH's /opt/venv is this venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPORTS_")}
    for key, value in env_of(FINAL).items():
        env[key] = value.replace("/opt/venv/bin", str(Path(sys.executable).parent)).replace(
            "$PATH", os.environ.get("PATH", "")
        )
    env.update(extra)
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run an image command; ``python`` is this venv's interpreter, as /opt/venv/bin/python is the image's."""
    assert argv[0] == "python", argv
    return subprocess.run(
        [sys.executable, *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_dockerfile_builds_in_one_stage_and_runs_from_another_as_a_non_root_user() -> None:
    froms = [i for i in INSTRUCTIONS if i.keyword == "FROM"]
    assert len(froms) >= 2 and froms[0].args.endswith(" AS build")
    build_runs = " ".join(i.args for i in INSTRUCTIONS if i.stage == 0 and i.keyword == "RUN")
    assert "--only-binary=:all:" in build_runs  # nothing is compiled, so no compiler is needed anywhere
    final_runs = " ".join(i.args for i in FINAL if i.keyword == "RUN")
    for tool in ("pip ", "gcc", "build-essential", "make "):
        assert tool not in final_runs, f"{tool.strip()} in the final stage"
    # The final stage installs exactly the system packages the application runs (gpg, for OpenPGP files:
    # encoding/), without recommends, and leaves no package lists behind.
    installs = re.findall(r"apt-get install ([^&]*)", final_runs)
    assert [i.split() for i in installs] == [["-y", "--no-install-recommends", "gnupg"]], installs
    assert "rm -rf /var/lib/apt/lists/*" in final_runs
    copied_from_build = [i.args for i in FINAL if i.keyword == "COPY" and "--from=" in i.args]
    assert copied_from_build == ["--from=build /opt/venv /opt/venv"]  # the environment, not the sources
    user = last("USER").args
    assert user not in {"root", "0"} and not user.startswith("0:")
    assert "useradd --system --uid 10001" in final_runs
    # One image: the worker by default; the API and the migration are commands of the same image.
    assert exec_form(last("CMD").args) == ["python", "worker.py"]
    assert compose_command("api")[:3] == ["python", "starter.py", "serve"]
    assert compose_command("migrate") == ["python", "starter.py", "migrate"]
    assert healthcheck_command(last("HEALTHCHECK").args)[0] == "python"
    assert env_of(FINAL)["EXPORTS_HEALTH_URL"] == "http://127.0.0.1:9464/healthz"


def test_the_build_stage_installs_exactly_the_projects_runtime_dependencies(tmp_path: Path) -> None:
    import tomllib

    install = next(i.args for i in INSTRUCTIONS if i.stage == 0 and i.keyword == "RUN")
    extract = install.split(" && ")[0]  # writes requirements.txt from pyproject.toml
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    done = subprocess.run(["sh", "-c", extract.replace("python ", f"{sys.executable} ", 1)], cwd=tmp_path)
    assert done.returncode == 0
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert (tmp_path / "requirements.txt").read_text().splitlines() == wanted


def test_the_build_context_holds_everything_the_dockerfile_copies_and_nothing_else() -> None:
    patterns = dockerignore_patterns(ROOT / ".dockerignore")
    sources = [
        s for i in INSTRUCTIONS if i.keyword == "COPY" and "--from=" not in i.args for s in copy_sources(i)
    ]
    assert "pyproject.toml" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not dockerignore_excludes(patterns, source.rstrip("/")), f"{source} is left out of the context"
    for private in (
        ".venv/bin/python",
        ".git/config",
        "tests/conftest.py",
        "testbed/tls.py",
        "api/__pycache__/x.pyc",
    ):
        assert dockerignore_excludes(patterns, private), f"{private} would be sent to the builder"


def test_the_image_app_directory_alone_provides_every_module_the_commands_import(app_dir: Path) -> None:
    # The venv also has the project installed (editable): a module missing from /app would be found
    # there, so every module of ours that loads must come from app_dir.
    probe = (
        "import sys, worker, starter, api.server, api.app, db.migrate, db.builder, service.temporal\n"
        f"ours = {OUR_PACKAGES!r}\n"
        "outside = sorted(n for n, m in sys.modules.items() if n.split('.')[0] in ours\n"
        "                 and not (getattr(m, '__file__', None) or '').startswith(sys.argv[1]))\n"
        "print(outside); sys.exit(1 if outside else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(app_dir)],
        cwd=app_dir,
        env=image_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (app_dir / "api" / "templates").is_dir() and (app_dir / "db" / "migrations").is_dir()


def test_the_worker_and_starter_commands_start_as_the_image_runs_them(app_dir: Path) -> None:
    worker = run([*exec_form(last("CMD").args), "--help"], app_dir, image_env())
    assert worker.returncode == 0 and "usage: worker.py" in worker.stdout, worker.stderr
    starter = run(["python", "starter.py", "--help"], app_dir, image_env())
    assert starter.returncode == 0 and "migrate" in starter.stdout, starter.stderr


def test_the_migration_service_migrates_a_real_database(app_dir: Path, pg_server: str) -> None:
    name = f"fenced_image_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # a fresh name made here, not input
    env = image_env(EXPORTS_DATABASE_URL=pg.with_database(pg_server, name))
    first = run(compose_command("migrate"), app_dir, env)
    assert first.returncode == 0 and first.stdout.startswith("applied "), first.stderr
    again = run(compose_command("migrate"), app_dir, env)
    assert again.returncode == 0 and again.stdout.strip() == "already up to date"


def test_the_healthcheck_passes_against_the_running_api_and_fails_without_it(
    app_dir: Path, database: pg.TestDatabase
) -> None:
    port = free_port()
    # deploy/compose.yaml's API command; only the listening address is this machine's loopback.
    command = compose_command("api")
    command = [*command[: command.index("--host")], "--host", "127.0.0.1", "--port", str(port)]
    health_url = f"http://127.0.0.1:{port}/healthz"
    env = image_env(EXPORTS_DATABASE_URL=database.app_url, EXPORTS_HEALTH_URL=health_url)
    healthcheck = healthcheck_command(last("HEALTHCHECK").args)
    api = subprocess.Popen(
        [sys.executable, *command[1:]], cwd=app_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            check = run(healthcheck, app_dir, env, timeout=10)
            if check.returncode == 0:
                break
            assert api.poll() is None, api.stdout.read().decode() if api.stdout else ""
            assert time.monotonic() < deadline, check.stderr
            time.sleep(0.3)
    finally:
        api.terminate()
        api.wait(30)
        if api.stdout:
            api.stdout.close()
    down = run(healthcheck, app_dir, env, timeout=10)
    assert down.returncode != 0 and "Connection refused" in down.stderr


async def test_the_healthcheck_passes_against_the_running_worker_and_it_drains_on_sigterm(
    app_dir: Path, database: pg.TestDatabase, dev_server
) -> None:
    # The image's default health URL is the worker's own endpoint on its default metrics port.
    default = Settings.model_fields["metrics_port"].default
    assert env_of(FINAL)["EXPORTS_HEALTH_URL"] == f"http://127.0.0.1:{default}/healthz"
    port = free_port()  # 9464 itself may be taken on this machine; only the port differs from the image
    env = image_env(
        EXPORTS_DATABASE_URL=database.app_url,
        EXPORTS_TEMPORAL_ADDRESS=dev_server.client.service_client.config.target_host,
        EXPORTS_TASK_QUEUE=f"image-{uuid.uuid4().hex[:8]}",
        EXPORTS_METRICS_PORT=str(port),
        EXPORTS_TEMPORAL_METRICS_PORT=str(free_port()),
        EXPORTS_HEALTH_URL=f"http://127.0.0.1:{port}/healthz",
        EXPORTS_SHUTDOWN_GRACE_SECONDS="2",
    )
    healthcheck = healthcheck_command(last("HEALTHCHECK").args)
    command = exec_form(last("CMD").args)  # python worker.py, as the image starts it
    worker = await asyncio.create_subprocess_exec(
        sys.executable, *command[1:], cwd=app_dir, env=env, stdout=asyncio.subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            check = await asyncio.to_thread(run, healthcheck, app_dir, env, 10)
            if check.returncode == 0:
                break
            assert worker.returncode is None, f"worker.py exited {worker.returncode} before it was healthy"
            assert time.monotonic() < deadline, check.stderr
            await asyncio.sleep(0.3)
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(worker.wait(), 30) == 0
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    down = run(healthcheck, app_dir, env, timeout=10)
    assert down.returncode != 0 and "Connection refused" in down.stderr
