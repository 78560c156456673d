"""HTTP API and the operations console."""
