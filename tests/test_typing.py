"""The package is typed (py.typed): a user's script that type-checks against it sees the API's real types.

``fr2perfetto``'s top level imports the API lazily (PEP 562), which on its own would make every name of it
``object`` to a type checker; its ``TYPE_CHECKING`` imports and literal ``__all__`` give them their types.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is in the dev dependency group")

# A job manager's script, as a user writes it (the README's example, shortened), type-checked as strictly
# as mypy can: names imported from the package must be exported by it.
USER_SCRIPT = """\
import fr2perfetto
from fr2perfetto import Report

job = fr2perfetto.load("/shared/fr_dumps")
report: Report = fr2perfetto.analyze(job, inputs=["/shared/fr_dumps"])
reveal_type(job)
reveal_type(report)
reveal_type(report.to_json())
reveal_type(report.culprits[0].rank)
report.status + 1
"""


def _mypy(tmp_path: Path, source: str) -> list[str]:
    """mypy's lines on ``source`` (strict; no config file: the project's own settings are not the user's)."""
    script = tmp_path / "manager.py"
    script.write_text(source)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file=", f"--cache-dir={tmp_path / 'cache'}", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 2: mypy itself failed
    return done.stdout.splitlines()


def _qualified(name: str) -> str:
    """A revealed type's full name: mypy 2 leaves out the ``builtins.`` that mypy 1 writes."""
    return name if "." in name else f"builtins.{name}"


# Two seconds or so (mypy reads the package and what it imports, not torch): not marked slow.
def test_a_users_script_sees_the_apis_real_types(tmp_path: Path):
    lines = _mypy(tmp_path, USER_SCRIPT)
    found = (re.match(r".*manager\.py:(\d+): note: Revealed type is \"(.*)\"$", line) for line in lines)
    revealed = {int(m[1]): _qualified(m[2]) for m in found if m}
    assert revealed == {
        6: "fr2perfetto.read.job.Job",
        7: "fr2perfetto.api.Report",
        8: "builtins.str",
        9: "builtins.int",
    }, "\n".join(lines)
    errors = [line for line in lines if ": error: " in line]
    # the wrong use alone is an error: a str plus an int; nothing else (no Any, no missing export)
    assert len(errors) == 1 and re.match(r".*manager\.py:10: error: .*\[operator\]$", errors[0]), "\n".join(lines)
