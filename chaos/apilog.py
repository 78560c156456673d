"""Reading the API's stamped log: each traceback with its time, its exception and project frames, and the
route of the 5xx access line beside it."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from chaos.textual import normalize

_ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


_UUID_IN_PATH = re.compile(r"/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _route(method: str, path: str) -> str:
    path = path.split("?")[0]
    return f"{method} {_UUID_IN_PATH.sub('/{id}', path)}"


def parse_api_log(path: Path | None) -> list[dict[str, Any]]:
    """Tracebacks in the API's stamped log, each with its time, summary (the exception line and the
    innermost frame in the project) and the route of the 5xx access line next to it, if any."""
    if path is None or not path.exists():
        return []
    lines = path.read_text(errors="replace").splitlines()
    found: list[dict[str, Any]] = []
    i = 0
    while i < len(lines):
        stamp, _, text = lines[i].partition(" ")
        if "Traceback (most recent call last)" in text or "Exception in ASGI application" in text:
            start = i
            block = []
            j = i + 1 if "Exception in ASGI application" in text else i
            while j < len(lines):
                _, _, body = lines[j].partition(" ")
                if j > start + 1 and re.match(r"^(INFO|WARNING|ERROR|DEBUG|CRITICAL)[: ]", body):
                    break
                if body.startswith("---"):
                    break
                block.append(body)
                j += 1
            exception = next(
                (b for b in reversed(block) if b and not b.startswith(" ") and ":" in b),
                block[-1] if block else "",
            )
            frames = [
                re.sub(r'^File ".*?/([a-z_]+/[^/"]+\.py)", line (\d+), in (\S+)$', r"\1:\2 \3", b.strip())
                for b in block
                if b.strip().startswith('File "') and "/site-packages/" not in b and "/lib/python" not in b
            ]
            route = None
            for k in range(max(0, start - 3), min(len(lines), j + 3)):
                match = _ACCESS.search(lines[k])
                if match and match.group("status").startswith("5"):
                    route = _route(match.group("method"), match.group("path"))
                    break
            try:
                t = float(stamp)
            except ValueError:
                t = 0.0
            found.append({"t": t, "summary": f"{exception.strip()[:200]} at {' < '.join(reversed(frames[-3:])) or '?'}",
                          "route": route, "text": "\n".join(block)[-4000:]})  # fmt: skip
            i = j
            continue
        i += 1
    return found


def group_tracebacks(tracebacks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for tb in tracebacks:
        key = normalize(tb["summary"])
        group = groups.setdefault(
            key, {"summary": tb["summary"], "count": 0, "routes": Counter(), "example": tb["text"]}
        )
        group["count"] += 1
        group["routes"][tb["route"] or "?"] += 1
    return [{**g, "routes": dict(g["routes"])} for g in sorted(groups.values(), key=lambda g: -g["count"])]
