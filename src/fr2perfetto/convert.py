"""The steps behind the commands: analyse a loaded job, write its trace. I/O only at the edges."""

from __future__ import annotations

import bisect
import contextlib
import gzip
import io
import itertools
import multiprocessing
import os
import shutil
import stat
import sys
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import IO

from .base.cleanup import scratch_folder
from .base.gcpause import gc_paused
from .base.model import OK, Entry, Finding, MatchedOp
from .base.output import atomic_output
from .base.pools import process_pool
from .base.words import UNNAMED, group_in_words, lateness_track
from .diagnose.stragglers import group_offsets
from .diagnose.verdict import HANG, HEALTHY, Diagnosis, diagnose
from .layout.focus import focus_of, metadata_packet
from .layout.fold import View, full_view
from .layout.looks import Highlights
from .layout.rows import ITEM, SliceRows, job_rows
from .layout.scene import Slice, TimeSpan, Track
from .layout.timeline import (
    FINDINGS_UUID,
    drawn_counts,
    findings_tracks,
    items_per_rank,
    ops_by_rank,
    rank_notes,
    rank_timelines,
    time_span,
)
from .match.ops import match_ops
from .read.files import expand_inputs
from .read.job import Job
from .render.chrome_json import ChromeJsonWriter
from .render.perfetto import SEQUENCE_ID, PerfettoWriter, TraceStats


@dataclass(slots=True)
class Analysis:
    """A job's matched ops and what the diagnosis made of them."""

    job: Job
    ops: list[MatchedOp]
    diagnosis: Diagnosis


def analyse(job: Job) -> Analysis:
    """Match the job's ops across ranks and diagnose them."""
    ops = match_ops(job)
    return Analysis(job, ops, diagnose(job, ops))


def write_trace(analysis: Analysis, path: str, view: View | None = None, jobs: int = 1) -> TraceStats:
    """Write the Perfetto trace of an analysed job to ``path`` (atomically), showing ``view``.

    With ``jobs`` > 1 (Linux), the ranks' packets are made by that many forked processes, each
    writing its own packet sequence to a part file; the parts are then appended in rank order.
    """
    job, ops = analysis.job, analysis.ops
    span = time_span(job)
    view = view or full_view(job)
    as_json = output_format(path) == "json"
    in_parallel = not as_json and _can_fork(jobs, len(view.processes))
    index: dict[int, list[tuple[MatchedOp, list[Entry]]]] | None = None  # None: made by whoever writes the ranks
    if view.folded:
        index = ops_by_rank(ops, {rep for rep, _ in view.processes})
    drawn = drawn_counts(index, view) if index is not None and view.folded else None
    diagnosis = analysis.diagnosis
    offsets = diagnosis.evidence.clocks.offsets if diagnosis.evidence is not None else {}
    with_snapshots = {rank for rank, _ in view.processes if rank in job.snapshots}
    finding_tracks, highlights = findings_tracks(diagnosis.findings, span, drawn, diagnosis.roles, offsets,
                                                 with_snapshots)  # fmt: skip
    highlights.rank_notes = rank_notes(job, span, highlights)
    if diagnosis.evidence is not None:  # the lateness counters measure on the clocks stragglers are judged on
        highlights.enqueued.update(diagnosis.evidence.enqueue_medians)
        highlights.group_offsets = group_offsets(diagnosis.evidence)
    scene = _Scene(job, ops, index, span, highlights, view)
    with _destination(path) as raw, _maybe_gzip(raw, path) as out:
        writer = ChromeJsonWriter(out) if as_json else PerfettoWriter(out)
        problem_times = [op.first_time_ns for op in ops if op.status != OK]
        if problem_times:
            # Open the UI on the last tenth of the job before the first problem.
            writer.range_of_interest(max(span.start, min(problem_times) - (span.end - span.start) // 10))
        writer.explicit_process_order()
        focus = _focus(analysis, offsets, span, [rep for rep, _ in view.processes], finding_tracks)
        if focus is not None:
            writer.metadata(metadata_packet(focus, SEQUENCE_ID))
        _write_tracks(writer, finding_tracks)
        # isinstance, not as_json (the same test): the parallel writer is Perfetto's, as type checkers see
        if isinstance(writer, ChromeJsonWriter) or not in_parallel:
            _write_ranks(writer, scene, view.processes)
        else:
            folder = tempfile.gettempdir() if path == STDOUT else os.path.dirname(os.path.abspath(path))
            _write_ranks_in_parallel(writer, out, scene, jobs, folder)
        writer.finish()
    return writer.stats


def _top_finding(analysis: Analysis) -> Finding | None:
    verdict = analysis.diagnosis.verdict
    return next((f for f in analysis.diagnosis.findings if verdict.summary.endswith(f.summary)), None)


def left_out(analysis: Analysis, ranks: set[int] | None, groups: set[str] | None) -> str | None:
    """Where ``--ranks`` or ``--groups`` (``ranks``, ``groups``) leave out what the verdict is about (its
    finding's op on its first culprit, in that finding's group): one line that says so and what to add
    to include it, else None. A trace chosen that way looks complete, and its reader would never know."""
    verdict = analysis.diagnosis.verdict
    finding = _top_finding(analysis) or next(iter(analysis.diagnosis.findings), None)
    if verdict.status == HEALTHY or finding is None:
        return None
    culprits = verdict.culprit_ranks or finding.culprit_ranks
    rank = culprits[0] if culprits else None
    group = finding.group
    add: list[str] = []  # what to add to the options
    gone: list[str] = []  # what they leave out
    if ranks is not None and rank is not None and rank not in ranks:
        add.append(f"{rank} to --ranks")
        gone.append(f"rank {rank}")
    if groups is not None and group is not None and group.name not in groups and group.desc not in groups:
        # by its description, as the user names groups, unless it has none that tells it apart
        add.append(f"{group.desc if group.desc and group.desc != UNNAMED else group.name} to --groups")
        gone.append(group_in_words(group))
    if not add:
        return None
    if finding.op and group is not None:
        what = "the op that hung the job" if verdict.status == HANG else "the op the verdict is about"
        on = f" on rank {rank}" if rank is not None and ranks is not None else ""
        said = f"{what}, {finding.op} #{finding.seq} of {group_in_words(group)}{on}"
    else:  # a verdict about a rank, not an op (a crash, a straggler)
        said = f"{' and '.join(gone)}, which the verdict names"
    return f"the trace leaves out {said}: add {' and '.join(add)} to include it"


def _focus(
    analysis: Analysis, offsets: dict[int, int], span: TimeSpan, drawn: list[int], finding_tracks: list[Track]
) -> dict[str, object] | None:
    """Where the UI should open (``focus.focus_of``): the verdict's finding's op on every rank that
    took part in it, or should have, that finding's slice selected, the culprits pinned."""
    diagnosis = analysis.diagnosis
    finding = _top_finding(analysis)
    if finding is None:
        return None
    window = []
    for op in analysis.ops:
        if op.op_key in finding.op_keys:
            for rank, parts in op.entries.items():
                # where its enqueue is drawn, and where it ran (from its start, where it has one)
                started = (parts[-1].closed_by or parts[-1]).time_started_ns
                window += [t - offsets.get(rank, 0) for t in (parts[0].time_created_ns, started) if t]
            window += [op.first_time_ns] * bool(op.missing)  # where a rank's "never issued" is drawn
    number = diagnosis.findings.index(finding) + 1
    selected = next((t.slices[0] for t in finding_tracks if t.uuid == FINDINGS_UUID + number and t.slices), None)
    if not window and finding.window is not None:
        window = list(finding.window)  # what no op stands for: the time its stack snapshots span
    if not window and selected is not None:
        window = [selected.start]
    # The first time drawn: no earlier than the first entry of a drawn rank, as drawn, or a finding.
    firsts = [d.time_range[0] - offsets.get(r, 0) for r in drawn if (d := analysis.job.dumps.get(r)) and d.time_range]
    firsts += [t.slices[0].start for t in finding_tracks if t.slices]
    culprits = [f"rank {rank} · CULPRIT" for rank in diagnosis.verdict.culprit_ranks[:8]]
    if finding.kind == "straggler" and finding.group is not None:  # what shows it: how late it enqueues
        culprits += [lateness_track(finding.group, rank) for rank in finding.culprit_ranks[:8]]
    chosen = (selected.start, (selected.end or span.end) - selected.start) if selected is not None else None
    return focus_of(window, chosen, (min(firsts, default=span.start), span.end), culprits)


@dataclass(slots=True)
class _Scene:
    """Everything the ranks' timelines are made from."""

    job: Job
    ops: list[MatchedOp]
    index: dict[int, list[tuple[MatchedOp, list[Entry]]]] | None  # None: made by whoever writes the ranks
    span: TimeSpan
    highlights: Highlights
    view: View


def _write_tracks(writer: PerfettoWriter | ChromeJsonWriter, tracks: list[Track]) -> None:
    for track in tracks:
        writer.track(track)
    for track in tracks:
        writer.events(track)


def _write_ranks(
    writer: PerfettoWriter | ChromeJsonWriter,
    scene: _Scene,
    processes: list[tuple[int, tuple[int, ...]]],
    kept: list[object] | None = None,
) -> None:
    """Write the timelines of ``processes``; with ``kept``, what is made for them goes there, rather than
    being freed (see ``KEPT_ITEMS``), up to a bound. Where the index is made here, the ranks whose entries
    are columns are laid out from rows (``rows``), for Perfetto's format and a view that shows every op."""
    view = replace(scene.view, processes=processes)
    ranks = [rank for rank, _ in processes]
    rows = None
    if scene.index is None and isinstance(writer, PerfettoWriter) and view.groups is None and not view.cutoffs:
        rows = job_rows(scene.job, scene.ops, ranks)
    rest = {rank for rank in ranks if rows is None or rank not in rows.items}
    index = scene.index if scene.index is not None else ops_by_rank(scene.ops, rest) if rest else {}
    room = KEPT_ITEMS if kept is not None else 0
    if scene.index is None:  # made here: kept whole, or freed at the end
        room -= sum(map(len, index.values()))
        if room >= 0 and kept is not None:
            kept.append(index)
    for timeline in rank_timelines(scene.job, index, scene.span, scene.highlights, view, rows):
        _write_tracks(writer, timeline.tracks)
        held = rows.items.get(timeline.rank, b"") if rows is not None else b""
        made = sum(_made_slices(t.slices) for t in timeline.tracks)
        room -= len(index.get(timeline.rank, ())) + len(held) // ITEM.size + MADE_SLICE_ITEMS * made
        if room >= 0 and kept is not None:
            kept.append(timeline)


def _made_slices(slices: Sequence[Slice]) -> int:
    """How many of a track's slices were made as objects (a record's look of its own counts as one)."""
    return len(slices.extras) + len(slices.own_looks) if isinstance(slices, SliceRows) else len(slices)


# Parallel writing: below this many processes per worker, forking costs more than it saves.
MIN_PROCESSES_PER_WORKER = 8
# A forked writer ends with os._exit, which hands its memory back whole, while freeing each rank's entries
# and slices object by object once written takes about a fifth of its time. So it keeps them until it
# ends, up to this many of its ranks' ops (an item of the index each: about 700 bytes with its entry and
# its two slices), and frees what it makes beyond them as it goes.
KEPT_ITEMS = 1 << 18
# A slice made as an object, not a record (a send's or recv's, with a look of its own), holds about twice an
# item's bytes: it counts as this many items more.
MADE_SLICE_ITEMS = 2
_kept_until_exit: list[object] = []  # in a forked writer
_forked_scene: _Scene | None = None  # what forked workers inherit
_forked_output: int | None = None  # the output's file descriptor, where the first worker writes


def _can_fork(jobs: int, processes: int) -> bool:
    return jobs > 1 and sys.platform == "linux" and processes >= 2 * MIN_PROCESSES_PER_WORKER


def _write_part(task: tuple[list[tuple[int, tuple[int, ...]]], int, str | None]) -> TraceStats:
    """In a forked worker: write the packets of some ranks, on their own sequence, to a part file, or
    (no part file) straight to the output, whose file offset this process shares with its parent."""
    processes, sequence_id, part_path = task
    assert _forked_scene is not None
    if part_path is None:
        assert _forked_output is not None
        target = os.fdopen(os.dup(_forked_output), "wb", buffering=1 << 20)
    else:
        target = open(part_path, "wb")  # noqa: SIM115 (closed below)
    with gc_paused(), target:
        writer = PerfettoWriter(target, sequence_id=sequence_id)
        _write_ranks(writer, _forked_scene, processes, _kept_until_exit)
    return writer.stats


def _write_ranks_in_parallel(writer: PerfettoWriter, out: IO[bytes], scene: _Scene, jobs: int, folder: str) -> None:
    """The ranks' packets, made in ``jobs`` parts of about equal work, each by a forked worker on its own
    packet sequence: the first straight to the output (a file or a pipe), while the others write part
    files, appended in rank order once it is done. This process only waits: writing a part here too
    would copy every page it touches that the workers share (refcounts included), which costs it more
    than the part saves."""
    global _forked_scene, _forked_output
    processes = scene.view.processes
    count = min(jobs, len(processes) // MIN_PROCESSES_PER_WORKER)
    index = scene.index
    items = items_per_rank(scene.ops) if index is None else {rank: len(ops) for rank, ops in index.items()}
    bounds = even_bounds([items.get(rank, 0) + 1 for rank, _ in processes], count)
    direct = isinstance(out, io.BufferedWriter)  # not a compressing stream: the first part needs no copy
    if direct:
        out.flush()  # what this process wrote comes first; it writes nothing more until that part is done
    with scratch_folder(folder, ".fr2perfetto-") as scratch:
        tasks = [
            (
                processes[bounds[i] : bounds[i + 1]],
                SEQUENCE_ID + 1 + i,
                None if i == 0 and direct else os.path.join(scratch, f"part{i}"),
            )
            for i in range(count)
        ]
        _forked_scene, _forked_output = scene, out.fileno() if direct else None
        try:
            with process_pool(count, multiprocessing.get_context("fork")) as pool:  # a worker per part
                for (_, _, part_path), stats in zip(tasks, pool.map(_write_part, tasks), strict=True):
                    writer.stats.add(stats)
                    if part_path is not None:
                        _append(out, part_path)
                        os.unlink(part_path)
        except BrokenProcessPool:
            raise OSError("a writing process died (out of memory?); try -j 1 or a smaller --max-size") from None
        finally:
            _forked_scene = _forked_output = None


def _append(out: IO[bytes], part_path: str) -> None:
    """Append a part file to ``out``: by the kernel where ``out`` is a plain file or pipe (no copy
    through this process), else read and written."""
    with open(part_path, "rb") as part:
        done = 0
        if isinstance(out, io.BufferedWriter):
            out.flush()
            size = os.fstat(part.fileno()).st_size
            with contextlib.suppress(OSError):  # a destination sendfile cannot write to: copied below
                while done < size:
                    sent = os.sendfile(out.fileno(), part.fileno(), done, size - done)
                    if sent == 0:
                        break
                    done += sent
        part.seek(done)
        shutil.copyfileobj(part, out, 1 << 20)


def even_bounds(weights: list[int], count: int) -> list[int]:
    """Where to cut ``weights`` into ``count`` (at most ``len(weights)``) non-empty runs of about
    equal total weight: ``count + 1`` positions, from 0 to ``len(weights)``."""
    cumulative = list(itertools.accumulate(weights))
    total = cumulative[-1] if cumulative else 0
    bounds = [0]
    for part in range(1, count):
        cut = bisect.bisect_left(cumulative, total * part / count) + 1
        bounds.append(min(max(cut, bounds[-1] + 1), len(weights) - (count - part)))
    return [*bounds, len(weights)]


STDOUT = "-"  # the output path that means standard output


@contextlib.contextmanager
def _destination(path: str) -> Iterator[IO[bytes]]:
    """Standard output for ``-``; else a file written atomically."""
    if path == STDOUT:
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    with atomic_output(path) as out:
        yield out


def refuse_to_open(path: str) -> str | None:
    """Why ``path`` is not a trace the UI opens (one line), or None: a Perfetto trace begins with a
    packet (field 1, length-delimited: byte 0x0a), Chrome's JSON with ``{`` or ``[``; either may be
    gzipped. A Flight Recorder dump (a pickle) is named as one."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
            if head[:2] == b"\x1f\x8b":
                handle.seek(0)
                with gzip.GzipFile(fileobj=handle) as unpacked:
                    head = unpacked.read(64)
    except (OSError, EOFError, zlib.error) as error:
        return f"cannot read it ({getattr(error, 'strerror', None) or error})"
    if head[:1] == b"\x0a" or head.lstrip()[:1] in (b"{", b"["):
        return None
    if head[:1] == b"\x80":
        return "a Flight Recorder dump, not a trace: convert it first (fr2perfetto convert DUMPS -o trace.pftrace)"
    return "not a trace (neither Perfetto's format nor Chrome's JSON)"


def refuse_output(path: str, inputs: list[str]) -> str | None:
    """Why ``path`` must not be written (one line), or None: it must never replace evidence, so not one
    of the ``inputs``' files, and nothing but a regular file (not a symlink, a pipe, a device, a
    folder), which writing a temporary file and renaming it over would replace; and only into a folder
    that exists."""
    if path == STDOUT:
        return "refusing to write a binary trace to a terminal" if sys.stdout.isatty() else None
    unnamed = None
    if output_format(path) is None:
        known = ", ".join([*PERFETTO_SUFFIXES, *JSON_SUFFIXES])
        unnamed = f"the name says no format: end it with one of {known} (or that and .gz)"
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):  # as cp does: a trace never makes folders (run as root: /etc/x)
        return f"its folder {folder} does not exist"
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return unnamed
    except OSError as error:
        return f"cannot check it ({error.strerror or error})"
    if not stat.S_ISREG(status.st_mode):
        return "exists and is not a regular file (a symlink, pipe, device or folder): refusing to replace it"
    files, _ = expand_inputs(inputs)
    for name in files:
        with contextlib.suppress(OSError):
            if os.path.samefile(name, path):
                return "is one of the input dumps: refusing to overwrite it"
    return unnamed


# What an output's name may end with, each plain or gzipped: Perfetto's own, then Chrome's JSON.
PERFETTO_SUFFIXES = (".pftrace", ".perfetto-trace", ".pb")
JSON_SUFFIXES = (".json",)


def output_format(path: str) -> str | None:
    """``perfetto`` or ``json`` (Chrome's format), from the name's ending (``.gz`` aside); None for a name
    that says neither (standard output, ``-``: Perfetto's)."""
    if path == STDOUT:
        return "perfetto"
    name = path.lower().removesuffix(".gz")
    if name.endswith(PERFETTO_SUFFIXES):
        return "perfetto"
    return "json" if name.endswith(JSON_SUFFIXES) else None


@contextlib.contextmanager
def _maybe_gzip(out: IO[bytes], path: str) -> Iterator[IO[bytes]]:
    if not path.lower().endswith(".gz"):
        yield out
        return
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0) as compressed:
        yield compressed  # type: ignore[misc]
