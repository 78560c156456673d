"""Just enough of the Dockerfile and .dockerignore formats to check them and run what they run."""

from __future__ import annotations

import fnmatch
import json
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    args: str
    stage: int  # 0 for the first FROM's stage


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped; ``stage`` counts FROMs."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    instructions: list[Instruction] = []
    stage = -1
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, args.strip(), max(stage, 0)))
    return instructions


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def exec_form(args: str) -> list[str]:
    """A JSON exec form (``["python", "worker.py"]``); the shell form is refused (no signals to PID 1)."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def healthcheck_command(args: str) -> list[str]:
    options, _, command = args.partition("CMD ")
    assert command, f"HEALTHCHECK without CMD: {args}"
    return exec_form(command)


def env_of(instructions: list[Instruction]) -> dict[str, str]:
    """The ENV of these instructions (``K=V`` pairs; ``$VAR`` left unexpanded)."""
    env: dict[str, str] = {}
    for i in instructions:
        if i.keyword == "ENV":
            for pair in shlex.split(i.args):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def copy_sources(instruction: Instruction) -> list[str]:
    """The context paths a ``COPY`` (without ``--from``) takes; its last word is the destination."""
    words = [w for w in shlex.split(instruction.args) if not w.startswith("--")]
    return words[:-1]


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Whether ``path`` (relative, ``/``-separated) is left out of the build context.

    As Docker reads the file: a pattern matches a path or any of its parent directories, ``**/`` matches
    at any depth, ``!`` re-includes, and the last matching pattern wins.
    """
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = (pattern[1:] if negate else pattern).rstrip("/")
        if body.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(part, body[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatchcase(prefix, body) for prefix in prefixes)
        if hit:
            excluded = not negate
    return excluded


def dockerignore_patterns(path: Path) -> list[str]:
    return [
        line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
