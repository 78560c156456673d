"""The operations shared by the HTTP API and the command line, returning typed outcomes."""
