"""The project's soak: ``python -m chaos`` (and ``make soak``).

It starts the real stack on loopback (embedded PostgreSQL, the Temporal dev server with a persistence
file, an OpenSSH sshd partner, ``worker.py`` processes and ``python starter.py serve``, with TCP proxies
between the workers and PostgreSQL and between the workers and the partner), drives exports through the
HTTP API with cancels at every point, terms edits, duplicate creates and replacements, injects faults by
real means, lets recovery settle, and audits the invariants from the database, from a watch on the
partner's directory, from what the clients were told, from the API's log and from every workflow
history. Seeded: the same seed gives the same schedule.

- ``config``: the knobs; ``plan``: the seeded schedule; ``stack``: the servers and processes;
- ``client``: the journaled HTTP client and the status board; ``driver``: the clients' scripts;
- ``faults``: the fault injector; ``audit``: the invariants, reading ``histories`` (workflow histories)
  and ``apilog`` (the API's tracebacks); ``report``: the report; ``soak``: one run.
"""
