"""Shared fixtures: real gloo jobs (run once per session) and NCCL-layout dumps."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "samples"))

import gloo_jobs  # noqa: E402
import nccl_layout  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that reads a real gloo job's dumps starts that job: ``make test-fast`` leaves it out."""
    for item in items:
        if "gloo_job" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.torch_job)


def run_once(tmp_path_factory: pytest.TempPathFactory, run_scenario: Callable[[str, str], list[str]],
             check: Callable[[str, list[str]], None] | None = None) -> Callable[[str], Path]:  # fmt: skip
    """A function that runs a real job's scenario into a folder of its own the first time it is asked
    for it in a session, and returns that folder (``check(name, files)`` looks at what it wrote)."""
    cache: dict[str, Path] = {}

    def run(name: str) -> Path:
        if name not in cache:
            folder = tmp_path_factory.mktemp(name) / "dumps"
            files = run_scenario(name, str(folder))
            if check is not None:
                check(name, files)
            cache[name] = folder
        return cache[name]

    return run


@pytest.fixture(scope="session")
def gloo_job(tmp_path_factory: pytest.TempPathFactory):
    """Run a real gloo scenario once per session; return the folder of its dumps."""
    cache: dict[str, Path] = {}

    def run(name: str) -> Path:
        if name not in cache:
            out = tmp_path_factory.mktemp(f"gloo_{name}")
            files = gloo_jobs.run_scenario(name, str(out))
            assert len(files) == gloo_jobs.SCENARIOS[name][0], f"{name}: {files}"
            cache[name] = out
        return cache[name]

    return run


@pytest.fixture()
def nccl_job(tmp_path: Path):
    """Write an NCCL-layout scenario; return the folder of its dumps."""

    def write(name: str) -> Path:
        out = tmp_path / name
        nccl_layout.write_scenario(name, str(out))
        return out

    return write


def start_rank(command: list[str], env: dict[str, str], **options: object) -> subprocess.Popen[bytes]:
    """Start one rank of a job in a session of its own: ``stop_ranks`` ends it with every process it
    started (PyTorch's debug server runs workers that outlive a killed rank)."""
    return subprocess.Popen(command, env=env, start_new_session=True, **options)  # type: ignore[call-overload]


def stop_ranks(ranks: list[subprocess.Popen[bytes]]) -> None:
    """Kill what ``start_rank`` started, children included, and reap it."""
    for process in ranks:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run_cli(*args: str) -> tuple[int, str, str]:
    """Run the CLI in-process; return (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    from fr2perfetto.cli import app

    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "100", "NO_COLOR": "1"})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
