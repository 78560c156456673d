"""An encrypted, gzipped delivery of 1M contacts, fenced, against ``psql \\copy | gzip | gpg --encrypt``
and OpenSSH ``sftp`` of the same rows, side by side in one run (issue #24, item 5).

Ours is the worker's own path without Temporal, every statement included: ``claim_if_queued`` (cutoff 1),
the builder in the destination's format (COPY, gzip on its own thread, ``gpg`` fed by a pipe, both sides
hashed as they are written), ``authorize_delivery_if_running`` with the file evidence (cutoff 2), the
upload fence, ``deliver()`` to a real OpenSSH sshd (baseline listing, exclusive upload with 255 KiB
pipelined writes, the rename fence, the no-overwrite rename, the stat read-back), each observation
appended as evidence, and ``finish_delivery``. The reference is a shell pipeline as an operator would
write it: ``psql -c '\\copy (...) TO STDOUT' | gzip | gpg --encrypt --recipient-file KEY > FILE``, then
``sftp -b`` ``put`` with the same cipher (``aes128-gcm@openssh.com``). It hashes nothing and writes no row.

Rounds alternate ours / reference. Wall: the reference's seconds over ours (at least 0.9x is the target);
CPU: ours over the reference's (at most 1.5x), this process's CPU plus its finished children's (gpg, psql,
gzip, sftp, bash), never the servers'. Each is the median of the rounds' pairs with its 95 % bootstrap
interval. Both deliveries are decrypted with the partner's ``gpg`` once and must give back the same CSV.
Needs root, ``openssh-server``, ``gpg`` and ``gzip``.

    python -m bench.pgp [--rows 1000000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.builder import find_psql
from bench.obs.measures import median_interval
from db.admin import seed_tenant
from db.builder import build_export, copy_statement, remove_export_file
from db.pool import open_pool
from db.stores.api import ApiStore
from db.stores.protocol import WorkerStore
from domain.file_format import FileFormat
from domain.models import AuthorizationResult, ClaimResult, DeliveryOutcome, FenceResult, FinishResult
from partner.delivery import FileToDeliver, deliver
from partner.protocol import DeliveryHooks
from testbed.gpg import GpgIdentity
from testbed.pg import APP_LOGIN, clone_database, make_template, postgres_server, with_database
from testbed.sftp import Sshd, sshd_available

CIPHER = "aes128-gcm@openssh.com"
WALL_TARGET, CPU_TARGET = 0.9, 1.5
WORKER = "bench-pgp"


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class Round:
    wall: float
    cpu: float
    remote: Path
    plain_sha256: bytes | None = None
    steps: dict[str, float] | None = None  # ours: wall seconds by step


@dataclass
class Bench:
    worker: WorkerStore
    api: ApiStore
    pool: Any
    tenant_id: uuid.UUID
    destination_id: uuid.UUID
    list_name: str
    work_dir: Path
    sshd: Sshd
    partner: GpgIdentity
    psql: str
    psql_url: str


async def run_ours(bench: Bench) -> Round:
    """One fenced export through the worker's statements and code path (see the module docstring)."""
    created = await bench.api.create_original(
        tenant_id=bench.tenant_id,
        destination_id=bench.destination_id,
        list_name=bench.list_name,
        created_by="bench",
    )
    job = await bench.worker.get_job(created.job_id)
    assert job is not None
    attempt = uuid.uuid4()
    loop = asyncio.get_running_loop()
    cpu, started = _cpu(), time.perf_counter()
    steps: dict[str, float] = {}
    mark = started

    def step(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        steps[name] = now - mark
        mark = now

    assert await bench.worker.claim_if_queued(job.id, job.version, attempt, WORKER) == ClaimResult.CLAIMED
    destination = await bench.worker.load_destination(job.tenant_id, job.destination_id)
    built = await build_export(
        bench.pool,
        tenant_id=job.tenant_id,
        list_name=job.list_name,
        delivery_key=job.delivery_key,
        attempt_id=attempt,
        work_dir=bench.work_dir,
        file_format=destination.file_format,
    )
    step("claim and build (COPY, gzip, gpg)")
    answer = await bench.worker.authorize_delivery_if_running(
        tenant_id=job.tenant_id,
        job_id=job.id,
        attempt_id=attempt,
        replaces_job_id=None,
        final_name=built.final_name,
        length=built.size,
        sha256=built.sha256,
        rows=built.rows,
        evidence=built.evidence(),
    )
    assert answer == AuthorizationResult.AUTHORIZED, answer
    assert await bench.worker.fence_upload_if_delivering(job.id, attempt) == FenceResult.FENCED
    step("cutoff 2 and the upload fence")
    observations: list[dict[str, Any]] = []

    def rename_fence() -> bool:
        fenced = asyncio.run_coroutine_threadsafe(
            bench.worker.fence_rename_if_delivering(job.id, attempt), loop
        )
        return fenced.result(timeout=30) == FenceResult.FENCED

    report = await asyncio.to_thread(
        deliver,
        destination,
        FileToDeliver(built.path, built.final_name, built.size, built.sha256),
        attempt,
        original=None,
        overwrite_agreed=False,
        on_evidence=observations.append,
        hooks=DeliveryHooks(authorize_rename=rename_fence),
    )
    step("deliver() to sshd")
    for observation in observations:
        await bench.worker.append_delivery_evidence(job.id, attempt, WORKER, observation)
    finished = await bench.worker.finish_delivery(
        job.id, attempt, report.outcome, None, summary=report.summary
    )
    step("evidence and the terminal write")
    wall, cpu = time.perf_counter() - started, _cpu() - cpu
    remove_export_file(built.path)
    if report.outcome != DeliveryOutcome.COMPLETED or finished != FinishResult.WRITTEN:
        raise SystemExit(f"our delivery did not complete: {report.summary} ({finished})")
    return Round(wall, cpu, bench.sshd.upload_dir / built.final_name, built.plain_sha256, steps)


def run_reference(bench: Bench, key_file: Path, known_hosts: Path) -> Round:
    """``psql \\copy | gzip | gpg --encrypt > file``, then ``sftp -b`` put of the file, timed together."""
    name = f"reference-{uuid.uuid4().hex[:12]}.csv.gz.pgp"
    local = bench.work_dir / name
    script = bench.work_dir / "copy.sql"
    copy = " ".join(copy_statement(FileFormat()).decode().split()).removeprefix("COPY")
    script.write_text(
        "SET ROLE exports_worker;\nBEGIN READ ONLY;\n"
        "SELECT set_config('fenced_exports.tenant_id', :'tenant', true),"
        " set_config('fenced_exports.list_name', :'list', true) \\g /dev/null\n"
        f"\\copy{copy}\nCOMMIT;\n"
    )
    psql = [
        bench.psql,
        bench.psql_url,
        "-q",
        "-X",
        "-v",
        "ON_ERROR_STOP=1",
        "-v",
        f"tenant={bench.tenant_id}",
    ]
    psql += ["-v", f"list={bench.list_name}", "-f", str(script)]
    gpg = ["gpg", "--homedir", str(bench.work_dir / "gnupg"), "--batch", "--quiet", "--trust-model", "always"]
    gpg += ["--compress-algo", "none", "--recipient-file", str(key_file), "--encrypt"]
    pipeline = f"{shlex.join(psql)} | gzip | {shlex.join(gpg)} > {shlex.quote(str(local))}"
    batch = bench.work_dir / "put.batch"
    batch.write_text(f'put "{local}" "{bench.sshd.upload_dir / name}"\n')
    sftp = ["sftp", "-q", "-b", str(batch), "-c", CIPHER, "-i", str(bench.sshd.client_key_path)]
    sftp += ["-P", str(bench.sshd.port), "-o", f"UserKnownHostsFile={known_hosts}", "-o", "BatchMode=yes"]
    sftp += [f"partner@{bench.sshd.host}"]
    cpu, started = _cpu(), time.perf_counter()
    subprocess.run(["bash", "-o", "pipefail", "-c", pipeline], check=True)
    built = time.perf_counter()
    subprocess.run(sftp, check=True, stdout=subprocess.DEVNULL)
    wall, cpu = time.perf_counter() - started, _cpu() - cpu
    local.unlink()
    steps = {"psql | gzip | gpg": built - started, "sftp put": wall - (built - started)}
    return Round(wall, cpu, bench.sshd.upload_dir / name, steps=steps)


def decrypted_csv_sha256(partner: GpgIdentity, path: Path) -> bytes:
    decrypted = partner.decrypt(path)
    if decrypted.returncode != 0:
        raise SystemExit(f"the partner's gpg could not decrypt {path.name}: {decrypted.status}")
    return hashlib.sha256(gzip.decompress(decrypted.data)).digest()


async def main(rows: int, rounds: int) -> dict[str, float]:
    """Run the comparison; print and return the medians, the ratios and their intervals."""
    if not sshd_available() or not shutil.which("sftp") or not shutil.which("gpg"):
        raise SystemExit("needs root, /usr/sbin/sshd, the sftp client and gpg")
    psql = find_psql()
    scratch = Path(tempfile.mkdtemp(prefix="fenced-bench-pgp-"))
    partner = GpgIdentity.generate("Bench partner <partner@bench.example>", scratch)
    key_file = scratch / "partner.asc"
    key_file.write_text(partner.public_key)
    (scratch / "work" / "gnupg").mkdir(parents=True, mode=0o700)
    sshd = Sshd.start()
    try:
        known_hosts = scratch / "known_hosts"
        known_hosts.write_text(f"[{sshd.host}]:{sshd.port} {sshd.host_key_line}\n")
        with postgres_server() as server_url:
            database = clone_database(server_url, make_template(server_url))
            seeded = await seed_tenant(
                database.admin_url,
                tenant_name="bench",
                destination_name="partner-pgp",
                destination={
                    "host": sshd.host,
                    "port": sshd.port,
                    "username": "partner",
                    "host_key": sshd.host_key_line,
                    "credential_ref": str(sshd.client_key_path),
                    "remote_dir": str(sshd.upload_dir),
                    "max_write_request": 261120,
                    "hash_evidence": "none",
                    "compression": "gzip",
                    "pgp_recipient_keys": [partner.public_key],
                },
                contacts=rows,
            )
            worker_pool = await open_pool(database.app_url, "exports_worker", max_size=4)
            build_pool = await open_pool(database.app_url, "exports_worker", max_size=2)
            api_pool = await open_pool(database.app_url, "exports_api", max_size=2)
            bench = Bench(
                worker=WorkerStore(worker_pool),
                api=ApiStore(api_pool),
                pool=build_pool,
                tenant_id=seeded.tenant_id,
                destination_id=seeded.destination_id,
                list_name=seeded.list_name,
                work_dir=scratch / "work",
                sshd=sshd,
                partner=partner,
                psql=psql,
                psql_url=with_database(server_url, database.name, user=APP_LOGIN),
            )
            ours: list[Round] = []
            reference: list[Round] = []
            try:
                for index in range(rounds):
                    ours.append(await run_ours(bench))
                    reference.append(run_reference(bench, key_file, known_hosts))
                    if index == 0:  # the partner reads both, and they hold the same CSV
                        mine = decrypted_csv_sha256(partner, ours[0].remote)
                        theirs = decrypted_csv_sha256(partner, reference[0].remote)
                        if not mine == theirs == ours[0].plain_sha256:
                            raise SystemExit("the two deliveries do not decrypt to the same CSV")
                    sizes = (ours[-1].remote.stat().st_size, reference[-1].remote.stat().st_size)
                    ours[-1].remote.unlink()
                    reference[-1].remote.unlink()
            finally:
                for pool in (worker_pool, build_pool, api_pool):
                    await pool.close()
    finally:
        sshd.stop()
        partner.close()
        shutil.rmtree(scratch, ignore_errors=True)
    wall_pairs = [r.wall / o.wall for o, r in zip(ours, reference, strict=True)]
    cpu_pairs = [o.cpu / r.cpu for o, r in zip(ours, reference, strict=True)]
    (wall_low, wall_high), (cpu_low, cpu_high) = median_interval(wall_pairs), median_interval(cpu_pairs)
    result = {
        "ours_wall_s": statistics.median(o.wall for o in ours),
        "reference_wall_s": statistics.median(r.wall for r in reference),
        "ours_cpu_s": statistics.median(o.cpu for o in ours),
        "reference_cpu_s": statistics.median(r.cpu for r in reference),
        "wall_ratio": statistics.median(wall_pairs),
        "wall_ratio_low": wall_low,
        "wall_ratio_high": wall_high,
        "cpu_ratio": statistics.median(cpu_pairs),
        "cpu_ratio_low": cpu_low,
        "cpu_ratio_high": cpu_high,
    }
    print(
        f"rows: {rows:,}  rounds: {rounds} (pairs, medians)  cpus: {os.cpu_count()}  "
        f"load: {os.getloadavg()[0]:.2f}  delivered bytes ours/reference: {sizes[0]:,} / {sizes[1]:,}"
    )
    print(
        f"ours (fenced)   : wall {result['ours_wall_s']:.2f} s  cpu {result['ours_cpu_s']:.2f} s  "
        f"{[round(o.wall, 2) for o in ours]}"
    )
    print(
        f"psql|gzip|gpg + sftp: wall {result['reference_wall_s']:.2f} s  cpu {result['reference_cpu_s']:.2f} s  "
        f"{[round(r.wall, 2) for r in reference]}"
    )
    for label, rounds_ in (("ours", ours), ("reference", reference)):
        assert rounds_[0].steps is not None
        parts = ", ".join(
            f"{name} {statistics.median(r.steps[name] for r in rounds_ if r.steps):.2f} s"
            for name in rounds_[0].steps
        )
        print(f"  {label} by step (medians): {parts}")
    print(
        f"wall, reference/ours: {result['wall_ratio']:.2f}x ({wall_low:.2f}-{wall_high:.2f}, target >= {WALL_TARGET})"
        f"   cpu, ours/reference: {result['cpu_ratio']:.2f}x ({cpu_low:.2f}-{cpu_high:.2f}, target <= {CPU_TARGET})"
    )
    return result


def run_with_defaults() -> None:
    asyncio.run(main(rows=1_000_000, rounds=10))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=10)
    options = parser.parse_args()
    asyncio.run(main(options.rows, options.rounds))
