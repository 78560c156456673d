"""The claim's policy check: side-effect free, for the version of the terms the worker read (000 "The Worker")."""

from __future__ import annotations

from dataclasses import dataclass

from domain.models import ExportJob


@dataclass(frozen=True)
class PolicyDecision:
    """Allowed, or refused with the reason recorded on the Rejected row."""

    allowed: bool
    reason: str = ""


def evaluate_policy(job: ExportJob) -> PolicyDecision:
    """Whether the queued export ``job`` may be claimed for the terms it holds now.

    The destination belonging to the job's tenant is enforced by the schema's composite foreign key; the
    check here is that the export names a list: a blank or oversized list name is refused.
    """
    name = job.list_name
    if not name.strip():
        return PolicyDecision(False, "policy: no contact list named")
    if len(name) > 200 or any(ord(ch) < 32 for ch in name):
        return PolicyDecision(False, "policy: list name not allowed")
    return PolicyDecision(True)
