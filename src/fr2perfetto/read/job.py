"""Load every rank's dump of a job and work out its process groups.

``load_job`` is the I/O edge: it expands the inputs, reads the files (in parallel when asked),
collects one ``LoadProblem`` per bad file and resolves groups. ``resolve_groups`` is pure.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TypeVar

from ..base.gcpause import gc_paused
from ..base.model import (
    LOG_EXCEPTION,
    MAX_RANK,
    Group,
    LoadProblem,
    LogEvent,
    RankDump,
    StackSnapshot,
    group_counts,
    plausible_time,
    ranks_label,
)
from ..base.pools import process_pool
from ..base.text import is_number, path_text, shown
from .columns import ColumnBytes, JobTables, Tables, column_bytes
from .files import parse_dump_name
from .inputs import SMALL_TEXT_LIMIT, TEXT_LIMIT, Found, find_inputs, read_limited
from .logs import parse_log
from .reader import MAX_DUMP_BYTES, DumpError, read_dump, read_dump_columns
from .redact import Redactor, redact_dumps, redact_evidence, redact_problems
from .runs import RankFile, Run, RunInfo, choose_run, find_runs, keeps_beside, left_out_notes, no_such_run
from .stacks import parse_stacks


@dataclass(slots=True)
class Job:
    """All that was read of one job: the dumps by rank, its groups and what went wrong."""

    dumps: dict[int, RankDump]
    groups: list[Group]
    # (rank, group name) -> the group that name means on that rank.
    group_of: dict[tuple[int, str], Group]
    problems: list[LoadProblem] = field(default_factory=list)
    stacks: dict[int, StackSnapshot] = field(default_factory=dict)  # rank -> its snapshot at the dumps' time
    # rank -> every snapshot of it, oldest first (those whose time is known; the others after them)
    snapshots: dict[int, list[StackSnapshot]] = field(default_factory=dict)
    log_events: list[LogEvent] = field(default_factory=list)
    # what the capture helper left beside the dumps (``capture``): rank -> how its process ended
    # (``exception: ...``, ``signal SIGTERM``, ``exit``, or ``running`` when dumped on request), and
    # rank -> (host, pid) of its process
    endings: dict[int, str] = field(default_factory=dict)
    processes: dict[int, tuple[str, int]] = field(default_factory=dict)
    # where the inputs held several runs of the job (``read.runs``): every one, newest first, and the
    # name of the one read; with one run, nothing
    runs: list[RunInfo] = field(default_factory=list)
    run: str = ""
    # group name -> how many members a pg_config claims for it that were not followed rank by rank:
    # far more ranks without a dump than the dumps read (``resolve_groups``); those ranks are unknown
    unfollowed: dict[str, int] = field(default_factory=dict)
    _by_rank: dict[int, list[Group]] | None = None
    _ranks: list[int] | None = None

    def host_of(self, rank: int) -> str | None:
        """The host of a rank, from its dump or its capture rank file; None where nothing says."""
        dump = self.dumps.get(rank)
        if dump is not None and dump.host:
            return dump.host
        process = self.processes.get(rank)
        return process[0] if process else None

    @property
    def ranks(self) -> list[int]:
        """Every rank known: those with a dump, every member of a group, and every rank below the highest of
        them (a job's global ranks are 0 to its world size - 1: a gap is a rank that left no dump, even where
        no group of those read lists it, as gloo's broken ``pg_config`` never does). The gap is filled only
        while it is in proportion to the dumps read: a file named rank_9999999 does not make ten million."""
        if self._ranks is None:
            known = set(self.dumps)
            for group in self.groups:
                known.update(group.members)
            if known and max(known) < 2 * len(self.dumps) + 8:
                known.update(range(max(known)))
            self._ranks = sorted(known)
        return self._ranks

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks that are members of a group but left no dump."""
        return [r for r in self.ranks if r not in self.dumps]

    def groups_of_rank(self, rank: int) -> list[Group]:
        """The groups ``rank`` is a member of, in the job's group order."""
        if self._by_rank is None:
            self._by_rank = {}
            for group in self.groups:
                for member in group.members:
                    self._by_rank.setdefault(member, []).append(group)
        return self._by_rank.get(rank, [])


_Read = TypeVar("_Read")


def _problem_or(read: Callable[[str], _Read], path: str) -> _Read | LoadProblem:
    """``read(path)``, or the ``LoadProblem`` that says why it failed."""
    try:
        with gc_paused():
            return read(path)
    except DumpError as error:
        return LoadProblem(path, str(error))
    except Exception as error:
        return LoadProblem(path, f"unreadable dump ({type(error).__name__}: {str(error)[:120]})")


# Entries cross from a reading process to the parent as columns (``read.columns``): a few byte strings
# and small tables per rank, where pickling one object per entry would cost several times as much. Bytes,
# not arrays: the parent makes the entries from bytes, and an array would be copied into bytes there.
Packed = tuple[RankDump, ColumnBytes, Tables]


def _read_packed(path: str, max_bytes: int = MAX_DUMP_BYTES) -> Packed | LoadProblem:
    """In a reading process: read one dump, its entries as columns (``_packed``)."""
    return _packed(path, max_bytes)


def _packed(path: str, max_bytes: int) -> Packed | LoadProblem:
    """Read one dump, its entries as columns, as a reading process sends it to the parent."""
    read = _problem_or(partial(read_dump_columns, max_bytes=max_bytes), path)
    if isinstance(read, LoadProblem):
        return read
    dump, rank_columns = read
    return dump, column_bytes(rank_columns), rank_columns.tables


def _unpack(packed: Packed | LoadProblem, tables: JobTables) -> RankDump | LoadProblem:
    """In the parent: a dump from what a reading process sent, its tables merged into the job's (so that
    ranks share one object per name, size, dtype list or stack) and its entries made from its columns."""
    if isinstance(packed, LoadProblem):
        return packed
    dump, rank_columns, rank_tables = packed
    tables.fill(dump, rank_columns, rank_tables)
    return dump


def _share_configs(dump: RankDump | LoadProblem, canonical: dict[object, object]) -> RankDump | LoadProblem:
    """``dump`` with the member lists of its ``pg_config`` made ``canonical``'s: every rank of a job of
    thousands lists the same thousands of members for its world group, which would otherwise be held
    once per rank."""
    if isinstance(dump, RankDump):
        for config in dump.pg_config.values():
            if config.ranks:
                config.ranks = canonical.setdefault(config.ranks, config.ranks)  # type: ignore[assignment]
    return dump


def read_files(
    paths: list[str],
    jobs: int = 1,
    progress: Callable[[int], None] | None = None,
    max_bytes: int = MAX_DUMP_BYTES,
) -> Iterable[RankDump | LoadProblem]:
    """Read each file into a dump or a problem, in the order given, over ``jobs`` processes; files over
    ``max_bytes`` are refused unread."""
    canonical: dict[object, object] = {}
    tables = JobTables(canonical)
    if jobs <= 1 or len(paths) < 4:
        for path in paths:
            result = _unpack(_packed(path, max_bytes), tables)
            if progress:
                progress(1)
            yield _share_configs(result, canonical)
        return
    done = 0
    try:
        with process_pool(min(jobs, len(paths))) as pool:  # never more workers than files
            chunks = max(1, min(16, len(paths) // (jobs * 8)))
            for packed in pool.map(partial(_read_packed, max_bytes=max_bytes), paths, chunksize=chunks):
                done += 1
                if progress:
                    progress(1)
                yield _share_configs(_unpack(packed, tables), canonical)
    except BrokenProcessPool:
        # A reading process died (the system ran out of memory, or it was killed): read the rest here.
        yield from read_files(paths[done:], 1, progress, max_bytes)


@gc_paused()  # a job is millions of objects without cycles: the collector would walk them again and again
def load_job(
    inputs: list[str],
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_dump_bytes: int = MAX_DUMP_BYTES,
    redact: bool = False,
    keep_names: bool = False,
    logs: list[str] | None = None,
    run: str | None = None,
) -> Job:
    """Read all dumps named by ``inputs`` (directories searched through, archives, files, globs) into a
    ``Job``, with the stack snapshots and logs found among them (and in ``logs``).

    Where the inputs hold several runs of the job (``read.runs``), only one is read: the newest, or the
    one ``run`` names; each other run is one note in ``Job.problems``, and ``Job.runs`` lists them all.
    ``progress(done, total)`` is called as files are read; files over ``max_dump_bytes`` are refused.
    ``redact``: every string of the dumps that is not PyTorch's own becomes a placeholder before
    anything is made from them (``redact``; ``keep_names`` keeps the script's function and file names).
    """
    found = find_inputs(inputs, max_dump_bytes, _read_member, logs)
    on_disk = [s.path for s in found.dumps]
    total = len(on_disk) + len(found.archived)
    done = 0

    def advance(count: int) -> None:
        nonlocal done
        done += count
        if progress:
            progress(done, total)

    problems = list(found.problems)
    if found.skipped:
        # where nothing else was found, the files skipped are the answer: fatal, and said so
        alone = not (on_disk or found.archived or found.problems)
        problems.append(LoadProblem(" ".join(inputs), skipped_text(found.skipped, alone), fatal=alone))
    workers = jobs if jobs is not None else (os.cpu_count() or 1)
    results = [*read_files(on_disk, workers, advance, max_dump_bytes), *found.archived]
    advance(len(found.archived))
    read = [result for result in results if not isinstance(result, LoadProblem)]
    problems += [result for result in results if isinstance(result, LoadProblem)]
    runs = find_runs(read, _rank_files(found), by_folder=not redact)
    if run is None:
        chosen = runs[0] if runs else None
    elif (chosen := choose_run(runs, run)) is None:
        problems.append(no_such_run(runs, run))
    dumps = _run_dumps(chosen, problems) if chosen is not None else {}
    if chosen is not None and len(runs) > 1:  # the other runs' files, and what lies beside them, left out
        problems += left_out_notes(runs, chosen, name_files=not redact)
        found = _beside_run(found, keeps_beside(chosen, runs))
    # Redaction is a view: everything beside the dumps is read all the same, then shown with the same
    # placeholders, so that the verdict is the one an unredacted run gives.
    redactor = Redactor(keep_names) if redact else None
    if redactor is not None:
        problems = redact_dumps(dumps, problems, redactor=redactor)
    job = build_job(dumps, problems)
    if chosen is not None and len(runs) > 1:
        job.runs, job.run = [_shown_run(each.info(), redactor) for each in runs], chosen.name
    beside: list[LoadProblem] = []
    job.snapshots, job.log_events = _evidence(found, dumps, beside)
    job.endings, job.processes, exceptions = _capture_files(found)
    job.log_events += exceptions
    if redactor is not None:
        redact_evidence(redactor, job.snapshots, job.log_events, job.endings, job.processes)
        beside = redact_problems(beside, redactor)
    job.problems += beside
    job.stacks = _choose_snapshots(job.snapshots, _dumped_at(dumps))
    return job


MAX_ENDING = 400  # characters of a .ended file kept: one exception line


def _capture_files(found: Found) -> tuple[dict[int, str], dict[int, tuple[str, int]], list[LogEvent]]:
    """What the capture helper left: how each rank ended (its ``.ended`` files: an exception is an event
    of the rank's own, as a log's would be), and each rank's host and pid (its rank file)."""
    endings: dict[int, str] = {}
    events: list[LogEvent] = []
    for source in found.endings:
        name = parse_dump_name(os.path.basename(source.path)[: -len(".ended")])
        try:
            text = read_limited(source, SMALL_TEXT_LIMIT).decode("utf-8", "replace")
            mtime = None if source.data is not None else os.stat(source.path).st_mtime_ns
        except OSError:
            continue
        line = shown((text.splitlines() or [""])[0].strip()[:MAX_ENDING])
        if name is None or not line:
            continue
        endings[name.rank] = line
        if line.startswith("exception: "):  # capture._excepthook: the exception that ended the rank
            events.append(LogEvent(name.rank, plausible_time(mtime), LOG_EXCEPTION, line.removeprefix("exception: "),
                                   path_text(source.path)))  # fmt: skip
    processes = {rank_file.rank: (rank_file.host, rank_file.pid) for rank_file in _rank_files(found)}
    return endings, processes, events


DUMP_NAMES = "nccl_trace_rank_0, gloo_trace_rank_3.json, rank_7 (a prefix, then the rank)"
NAMES_SHOWN = 3  # files named per reason they were skipped


def skipped_text(skipped: dict[str, list[str]], alone: bool) -> str:
    """Why files were skipped, naming the first few of each reason; ``alone``: nothing else was found,
    so also what a dump's name looks like."""
    total = sum(len(paths) for paths in skipped.values())
    reasons = []
    for why, paths in sorted(skipped.items()):
        names = ", ".join(path_text(os.path.basename(p)) for p in paths[:NAMES_SHOWN])
        more = f" and {len(paths) - NAMES_SHOWN} more" if len(paths) > NAMES_SHOWN else ""
        reasons.append(f"{why}: {names}{more}")
    files = "1 file" if total == 1 else f"{total} files"
    if alone:
        return f"no Flight Recorder dump among its {files} ({'; '.join(reasons)}); dumps are named like {DUMP_NAMES}"
    return f"{files} skipped ({'; '.join(reasons)})"


def _read_member(path: str, data: bytes) -> RankDump | LoadProblem:
    """A dump read from an archive's member."""
    return _problem_or(lambda _: read_dump(path, data), path)


def _run_dumps(run: Run, problems: list[LoadProblem]) -> dict[int, RankDump]:
    """The dumps of ``run`` by rank, with a note for each of its files read only in part and for each
    older snapshot of a rank's process (periodic snapshots, a copy: the one whose entries end later is
    used)."""
    for dump in [*run.dumps.values(), *(older for older, _ in run.older)]:
        if dump.skipped_entries:
            why = f"{dump.skipped_entries} malformed entries skipped ({dump.skipped_reason})"
            problems.append(LoadProblem(dump.path, why, fatal=False))
    for older, newer in run.older:
        problems.append(LoadProblem(older.path, f"rank {older.rank} has a newer dump, {newer.path}: this one "
                                    "skipped", fatal=False))  # fmt: skip
    return dict(run.dumps)


def _shown_run(info: RunInfo, redactor: Redactor | None) -> RunInfo:
    """A run as shown: with ``--redact``, its files named by rank only and its folders left out."""
    if redactor is None:
        return info
    files = tuple(redactor.paths.get(path) or redactor.file(path) for path in info.files)
    return replace(info, files=files, folders=())


def _rank_files(found: Found) -> list[RankFile]:
    """What each of the capture helper's rank files says (``capture.rank_file_text``: JSON with the rank,
    its host, pid, process start and run); a file that says it otherwise is passed over."""
    rank_files = []
    for source in found.rank_files:
        try:
            value = json.loads(read_limited(source, SMALL_TEXT_LIMIT))
            rank, host, pid = value["rank"], value["host"], value["pid"]
            start, run = value.get("start"), value.get("run")
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
        if not (
            type(rank) is int
            and 0 <= rank < MAX_RANK
            and type(pid) is int
            and 0 < pid < 1 << 31
            and isinstance(host, str)
        ):
            continue
        start = start if type(start) is int else None
        run = shown(run[:MAX_ENDING]) if isinstance(run, str) and run else None
        rank_files.append(RankFile(path_text(source.path), rank, shown(host[:MAX_ENDING]), pid, start, run))
    return rank_files


def _beside_run(found: Found, keeps: Callable[[str], bool]) -> Found:
    """``found`` with only the files beside the dumps that ``keeps`` (those of the run read)."""
    return replace(
        found,
        stacks=[s for s in found.stacks if keeps(s.path)],
        logs=[s for s in found.logs if keeps(s.path)],
        endings=[s for s in found.endings if keeps(s.path)],
        rank_files=[s for s in found.rank_files if keeps(s.path)],
    )


DEFAULT_GROUP = "0"  # the name PyTorch gives the group init_process_group makes (the first one named)


def _dumped_at(dumps: dict[int, RankDump]) -> int | None:
    """The last time any dump recorded: about when they were taken."""
    ends = [d.time_range[1] for d in dumps.values() if d.time_range]
    return max(ends) if ends else None


def _evidence(
    found: Found, dumps: dict[int, RankDump], problems: list[LoadProblem]
) -> tuple[dict[int, list[StackSnapshot]], list[LogEvent]]:
    """Every rank's stack snapshots, oldest first, and every log event."""
    dumped_at = _dumped_at(dumps)
    year = None
    if dumped_at is not None:
        import datetime

        year = datetime.datetime.fromtimestamp(dumped_at / 1e9).year
    snapshots: list[StackSnapshot] = []
    for source in found.stacks:
        try:
            text = read_limited(source, TEXT_LIMIT).decode("utf-8", "replace")
            mtime = None if source.data is not None else os.stat(source.path).st_mtime_ns
        except OSError as error:
            problems.append(LoadProblem(source.path, f"cannot read ({error.strerror or error})", fatal=False))
            continue
        notes: list[str] = []
        snapshots += parse_stacks(text, path_text(source.path), mtime, notes)
        problems += [LoadProblem(source.path, note, fatal=False) for note in notes]
    events: list[LogEvent] = []
    for source in found.logs:
        try:
            text = read_limited(source, TEXT_LIMIT).decode("utf-8", "replace")
        except OSError as error:
            problems.append(LoadProblem(source.path, f"cannot read ({error.strerror or error})", fatal=False))
            continue
        notes = []
        events += parse_log(text, path_text(source.path), year, notes)
        problems += [LoadProblem(source.path, note, fatal=False) for note in notes]
    by_rank: dict[int, list[StackSnapshot]] = defaultdict(list)
    for snapshot in sorted(snapshots, key=lambda s: (s.time_ns is None, s.time_ns or 0)):
        by_rank[snapshot.rank].append(snapshot)
    return dict(sorted(by_rank.items())), events


SNAPSHOT_MARGIN_NS = 60_000_000_000  # a snapshot this much after the dumps still counts as taken with them


def _choose_snapshots(by_rank: dict[int, list[StackSnapshot]], dumped_at: int | None) -> dict[int, StackSnapshot]:
    """Per rank, the newest snapshot taken before (or about when) the dumps were; where every snapshot
    is later (a clock or time zone apart), the earliest."""
    chosen = {}
    for rank, taken in by_rank.items():
        timed = sorted((s for s in taken if s.time_ns is not None), key=lambda s: s.time_ns or 0)
        if not timed:
            chosen[rank] = taken[-1]
            continue
        if dumped_at is None:
            chosen[rank] = timed[-1]
            continue
        before = [s for s in timed if (s.time_ns or 0) <= dumped_at + SNAPSHOT_MARGIN_NS]
        chosen[rank] = before[-1] if before else timed[0]
    return chosen


def build_job(dumps: dict[int, RankDump], problems: list[LoadProblem] | None = None) -> Job:
    """Make a ``Job`` from dumps already read."""
    ordered = dict(sorted(dumps.items()))
    doubts: list[LoadProblem] = []
    unfollowed: dict[str, int] = {}
    groups, group_of = resolve_groups(ordered, doubts, unfollowed)
    return Job(ordered, groups, group_of, list(problems or []) + doubts, unfollowed=unfollowed)


def resolve_groups(
    dumps: dict[int, RankDump], doubts: list[LoadProblem] | None = None, unfollowed: dict[str, int] | None = None
) -> tuple[list[Group], dict[tuple[int, str], Group]]:
    """Identify the job's process groups by name plus members, and what each name means per rank.

    Members come from a rank's own ``pg_config``, else from another rank's that lists it, else
    (gloo, whose ``pg_config`` is broken) from the ranks that have entries under that name. A claim
    that one rank alone makes and that members it names contradict (their own ``pg_config`` gives
    that group other members) is not believed, and said so in ``doubts``. Nor is a claim of far more
    ranks without a dump than the dumps read (``unfollowed_claim``): said in ``doubts``, and the number
    of members it claims put in ``unfollowed`` by group name.
    """
    used: dict[str, set[int]] = defaultdict(set)  # name -> ranks with entries under it
    descs: dict[str, Counter[str]] = defaultdict(Counter)
    for rank, dump in dumps.items():
        counts = dump.group_counts if dump.group_counts is not None else group_counts(dump.entries)
        for (name, desc), count in counts.items():
            used[name].add(rank)
            if desc:
                descs[name][desc] += count
    claims: dict[str, dict[int, tuple[int, ...]]] = defaultdict(dict)  # name -> rank -> members it claims
    config_desc: dict[str, str] = {}
    too_many: dict[str, tuple[int, int]] = {}  # name -> (members claimed, a rank claiming them)
    sizes: dict[tuple[int, ...], int] = {}  # members -> how many of them have no dump
    for rank, dump in dumps.items():
        for name, config in dump.pg_config.items():
            if config.ranks and unfollowed_claim(config.ranks, dumps, sizes):
                too_many[name] = max(too_many.get(name, (0, rank)), (len(config.ranks), rank))
            elif config.claimed:
                too_many[name] = max(too_many.get(name, (0, rank)), (config.claimed, rank))
            elif config.ranks:
                claims[name][rank] = config.ranks
                if config.desc:
                    config_desc.setdefault(name, config.desc)
    for name, (claimed, rank) in too_many.items():
        if unfollowed is not None:
            unfollowed[name] = claimed
        if doubts is not None:
            doubts.append(
                LoadProblem(
                    dumps[rank].path,
                    f"pg_config says group {name} has {claimed} ranks, far more than the {len(dumps)} dumps "
                    "read: its members are taken from the dumps, and the ranks without one are not followed",
                    fatal=False,
                )
            )
    believed = _believed_claims(dumps, claims, doubts if doubts is not None else [])
    configured: dict[str, set[tuple[int, ...]]] = defaultdict(set)
    for name, by_rank in believed.items():
        configured[name].update(by_rank.values())

    from_entries = {name: tuple(sorted(ranks)) for name, ranks in used.items()}
    # The default group is the world: ranks 0 to world size - 1, whether or not a rank's entries under it
    # survive (gloo names it "0", its pg_config lists no ranks). So a gap in the ranks seen is a rank that
    # left no dump; filled only while that is in proportion to the dumps read (a file named rank_9999999
    # does not make ten million ranks).
    if DEFAULT_GROUP in from_entries and DEFAULT_GROUP not in believed:
        world = 1 + max(max(dumps), max(from_entries[DEFAULT_GROUP]))
        if world <= 2 * len(dumps) + 8:
            from_entries[DEFAULT_GROUP] = tuple(range(world))

    def members_for(rank: int, name: str) -> tuple[int, ...]:
        own = believed.get(name, {}).get(rank)
        if own and rank in own:
            return own
        for ranks in sorted(configured.get(name, ())):
            if rank in ranks:
                return ranks
        return from_entries[name]

    keyed: dict[tuple[str, tuple[int, ...]], None] = {}
    membership: dict[tuple[int, str], tuple[int, ...]] = {}
    for name, ranks in used.items():
        for rank in ranks:
            members = members_for(rank, name)
            membership[(rank, name)] = members
            keyed[(name, members)] = None
    for name, member_sets in configured.items():
        for members in member_sets:
            keyed[(name, members)] = None

    def sort_key(key: tuple[str, tuple[int, ...]]) -> tuple[int, str, tuple[int, ...]]:
        name, members = key
        return (int(name) if is_number(name) and len(name) < 18 else 2**62, name, members)

    groups: dict[tuple[str, tuple[int, ...]], Group] = {}
    for order, key in enumerate(sorted(keyed, key=sort_key)):
        name, members = key
        desc = descs[name].most_common(1)[0][0] if descs[name] else config_desc.get(name, "")
        groups[key] = Group(name=name, desc=desc, members=members, order=order, members_label=ranks_label(members))
    group_of: dict[tuple[int, str], Group] = {}
    for (name, members), group in groups.items():
        for rank in members:
            group_of.setdefault((rank, name), group)
    for (rank, name), members in membership.items():
        group_of[(rank, name)] = groups[(name, members)]
    return list(groups.values()), group_of


# Ranks without a dump that a group's claimed members may hold, beyond four per dump read: each such
# rank costs a place in every op of the group (its ``missing``), so a claim of a million ranks that eight
# dumps make is not followed rank by rank. A real job of a few thousand ranks with a handful of dumps is.
MAX_UNSEEN_MEMBERS = 2048


def unfollowed_claim(members: tuple[int, ...], dumps: dict[int, RankDump], sizes: dict[tuple[int, ...], int]) -> bool:
    """Whether a claimed member list holds far more ranks without a dump than the dumps read
    (``MAX_UNSEEN_MEMBERS`` plus four per dump); ``sizes`` memoises the count per member list."""
    bound = MAX_UNSEEN_MEMBERS + 4 * len(dumps)
    if len(members) <= bound:
        return False
    unseen = sizes.get(members)
    if unseen is None:
        named = set(members)
        unseen = sizes[members] = len(members) - sum(1 for rank in dumps if rank in named)
    return unseen > bound


def _believed_claims(
    dumps: dict[int, RankDump], claims: dict[str, dict[int, tuple[int, ...]]], doubts: list[LoadProblem]
) -> dict[str, dict[int, tuple[int, ...]]]:
    """The ``pg_config`` claims to believe: every claim that two ranks or more make, and a claim one rank
    alone makes unless members it names say otherwise of that group in their own ``pg_config``."""
    believed: dict[str, dict[int, tuple[int, ...]]] = {}
    for name, by_rank in claims.items():
        support = Counter(by_rank.values())
        kept: dict[int, tuple[int, ...]] = {}
        for rank, members in by_rank.items():
            if support[members] == 1:
                named = set(members)
                against = [r for r, theirs in by_rank.items() if r != rank and r in named and theirs != members]
                if against:
                    doubts.append(
                        LoadProblem(
                            dumps[rank].path,
                            f"pg_config says group {name} has ranks {ranks_label(members)}; ranks "
                            f"{ranks_label(against)} say otherwise in theirs: not believed",
                            fatal=False,
                        )
                    )
                    continue
            kept[rank] = members
        believed[name] = kept
    return believed
