"""Thin adapters from Temporal activities to the store, the builder and the partner client."""
