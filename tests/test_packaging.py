"""What `python -m build` makes installs and runs on its own: the sdist holds the C source and the report's
schema, the wheel built from it holds them too, with the generated module, and, installed into a fresh
virtual environment, gives the verdict on a sample."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

from .conftest import ROOT


def _source_tree(to: Path) -> Path:
    """The files a clone has that the build reads, copied (the build writes build/ and egg-info beside
    them: never into the checkout)."""
    skip = shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info", "build")
    for name in ("pyproject.toml", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, to / name)
    shutil.copytree(ROOT / "src" / "fr2perfetto", to / "src" / "fr2perfetto", ignore=skip)  # follows the schema's link
    shutil.copytree(ROOT / "proto", to / "proto")
    return to


def test_sdist_and_wheel_install_into_a_fresh_venv(tmp_path: Path):
    (tmp_path / "src").mkdir()
    source = _source_tree(tmp_path / "src")
    dist = tmp_path / "dist"
    # --no-isolation: the build tools come from this environment (the test extra), not from a network
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [sdist] = dist.glob("fr2perfetto-*.tar.gz")
    [wheel] = dist.glob("fr2perfetto-*.whl")

    with tarfile.open(sdist) as tar:
        in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert {"src/fr2perfetto/_speedups.c", "proto/fr2perfetto_report.proto", "pyproject.toml"} <= in_sdist
    assert "src/fr2perfetto/proto/fr2perfetto_report_pb2.py" in in_sdist
    with zipfile.ZipFile(wheel) as whl:
        in_wheel = set(whl.namelist())
    assert {
        "fr2perfetto/_speedups.c",
        "fr2perfetto/proto/fr2perfetto_report.proto",
        "fr2perfetto/proto/fr2perfetto_report_pb2.py",
        "fr2perfetto/render/markdown.py",
        "fr2perfetto/read/job.py",
    } <= in_wheel
    assert not any(name.startswith(("tests/", "samples/")) for name in in_wheel)

    # A fresh venv with the wheel alone; its dependencies are borrowed from this environment's
    # site-packages by a .pth (not installed again: no network), where fr2perfetto itself is not.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
         str(wheel)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-2000:]
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = subprocess.run(
        [str(python), "-c", "import fr2perfetto, fr2perfetto.proto.fr2perfetto_report_pb2 as pb;"
         "from fr2perfetto.base.speedups import SPEEDUPS; print(fr2perfetto.__file__, SPEEDUPS is not None)"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr[-2000:]
    module_file, has_native = where.stdout.split()
    assert module_file.startswith(str(venv)), module_file
    assert has_native == ("True" if any(n.endswith(".so") for n in in_wheel) else "False")

    verdict = subprocess.run(
        [str(venv / "bin" / "fr2perfetto"), "analyze", str(ROOT / "samples" / "nccl" / "demo"), "--format", "json"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert verdict.returncode == 1, verdict.stderr
    assert json.loads(verdict.stdout)["verdict"]["culprit_ranks"] == [5]
