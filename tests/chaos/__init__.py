"""The soak, short: the real stack under every fault kind, in `make test`."""
