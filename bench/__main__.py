"""``make bench``: every side-by-side comparison, one after the other, each printing its ratio."""

from __future__ import annotations

import asyncio

from bench import builder, upload

if __name__ == "__main__":
    asyncio.run(builder.main(rows=1_000_000, runs=3))
    print()
    upload.main(megabytes=200, runs=3)
