"""The job store: every statement of the row protocol, named after its transition."""
