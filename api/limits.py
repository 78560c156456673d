"""Limits the HTTP layer enforces before a request reaches an operation."""

MAX_BODY_BYTES = 64 * 1024
