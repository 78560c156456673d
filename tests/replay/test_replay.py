"""Safe deploys of workflow code (issue 12): every recorded history replays against the current workflows.

The histories under ``tests/replay/histories`` were recorded from real runs (``python -m tests.replay.record``:
the demo's four exports, a recovery run and a sweeper run). Replaying them with temporalio's ``Replayer``
runs today's workflow code against the commands those runs issued, so a change that breaks determinism
(a command added, removed or reordered without ``workflow.patched``) fails here, before it ships. The last
test shows the check works, on a copy of ExportWorkflow whose command order is changed without a patch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from service.temporal import DATA_CONVERTER
from workflows.export import ExportWorkflow
from workflows.recovery import RecoveryWorkflow
from workflows.sweeper import SweeperWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


def test_histories_of_every_workflow_are_recorded() -> None:
    types = set()
    for path in HISTORIES:
        events = json.loads(path.read_text())["events"]
        types.add(events[0]["workflowExecutionStartedEventAttributes"]["workflowType"]["name"])
    assert types == {"ExportWorkflow", "RecoveryWorkflow", "SweeperWorkflow"}
    assert len(HISTORIES) >= 6


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_a_recorded_history_replays_against_the_current_workflows(path: Path) -> None:
    replayer = Replayer(
        workflows=[ExportWorkflow, RecoveryWorkflow, SweeperWorkflow], data_converter=DATA_CONVERTER
    )
    result = await replayer.replay_workflow(load(path), raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name} no longer replays: {result.replay_failure!r}"


# Not sandboxed: the sandbox would re-import this test module; the replayer's determinism check is the same.
@workflow.defn(name="ExportWorkflow", sandboxed=False)
class ReorderedExportWorkflow(ExportWorkflow):
    """ExportWorkflow with one command moved, and no ``workflow.patched``: a timer before the claim."""

    @workflow.run
    async def run(self, inp):  # type: ignore[no-untyped-def]
        await workflow.sleep(1)  # a new first command: the recorded first command was the claim
        return await super().run(inp)


async def test_a_workflow_whose_command_order_changed_without_a_patch_fails_to_replay() -> None:
    replayer = Replayer(workflows=[ReorderedExportWorkflow], data_converter=DATA_CONVERTER)
    history = load(next(p for p in HISTORIES if p.stem == "export-a-plain-delivery"))
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(history)
