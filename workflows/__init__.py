"""ExportWorkflow, RecoveryWorkflow, SweeperWorkflow: deterministic, no I/O, IDs only."""
