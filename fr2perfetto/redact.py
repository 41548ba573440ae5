"""Make a job safe to attach to a public issue: no hostnames, user paths or directory names.

Directories in stack frames become stable placeholders (``<dir3>/train.py:118``: the basename and
line stay readable), hosts become ``host1``, ``host2``..., and dump paths keep only their file name
with any host in it replaced. The same input always gets the same placeholders.
"""

from __future__ import annotations

import os
from dataclasses import replace

from .job import Job
from .model import Frame


class Redactor:
    """Hands out one placeholder per distinct directory or host, in order of first appearance."""

    def __init__(self) -> None:
        self.directories: dict[str, str] = {}
        self.hosts: dict[str, str] = {}
        self._frames: dict[Frame, Frame] = {}
        self._stacks: dict[tuple[Frame, ...], tuple[Frame, ...]] = {}

    def directory(self, path: str) -> str:
        if path not in self.directories:
            self.directories[path] = f"<dir{len(self.directories) + 1}>"
        return self.directories[path]

    def host(self, name: str) -> str:
        if name not in self.hosts:
            self.hosts[name] = f"host{len(self.hosts) + 1}"
        return self.hosts[name]

    def path(self, path: str) -> str:
        """``/home/alice/train.py`` to ``<dir1>/train.py``; a bare name or ``<string>`` stays."""
        directory, base = os.path.split(path)
        return f"{self.directory(directory)}/{base}" if directory else base

    def stack(self, frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
        known = self._stacks.get(frames)
        if known is None:
            known = self._stacks[frames] = tuple(self._frame(f) for f in frames)
        return known

    def _frame(self, frame: Frame) -> Frame:
        known = self._frames.get(frame)
        if known is None:
            known = self._frames[frame] = frame._replace(filename=self.path(frame.filename))
        return known


def redact_job(job: Job) -> Job:
    """Redact the job in place (its dumps' paths, hosts and every entry's frames) and return it."""
    redactor = Redactor()
    for rank in sorted(job.dumps):
        dump = job.dumps[rank]
        base = os.path.basename(dump.path)
        if dump.host:
            placeholder = redactor.host(dump.host)
            base = base.replace(dump.host, placeholder)
            dump.host = placeholder
        dump.path = f"<dumps>/{base}"
        dump.entries = [e._replace(frames=redactor.stack(e.frames)) if e.frames else e for e in dump.entries]
    job.problems = [replace(p, path=redactor.path(p.path)) for p in job.problems]
    return job
