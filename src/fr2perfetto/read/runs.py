"""Tell apart the separate runs of a job among the dumps read, so that a verdict is made of one run's.

People keep the dumps of every attempt of a job in one place: a subfolder per attempt, or the files of
several attempts side by side (names that carry a host or a time, ranks a later attempt did not have).
``find_runs`` sorts the dumps into runs from what the files say. It takes them newest first (by the
last time each recorded); each joins a run it fits, else starts one. A dump does not fit a run when

1. the capture helper's rank files give it and the run different run identities (the same identity
   always fits: it is the run's own word);
2. the run holds a dump of its rank from another process: another host or pid, or entries that
   disagree with it. Periodic snapshots of one process agree (the older one's entries are the newer
   one's, as far as both reach), and so do one process's two recorders (gloo and NCCL) side by side:
   the newest is used, the older one noted;
3. it names a process group the run knows with another description, or says the world has another
   size (the default group in ``pg_config``, where it lists the rank itself);
4. it ended before the run began (by more than ``CLOCK_SLACK_NS``: where a dump holds its process's
   first op, nothing wrapped away, its first time is when its process began), or more than
   ``RUN_GAP_NS`` before the run's first time: every rank of a run dumps within one collective timeout
   of its hang.

Among the runs a dump fits, it joins the one holding its process first (a process is of one run), then
one of its own folder, then the nearest in time. Runs come newest first, each named after the folder
its dumps alone sit in (sibling subfolders are usually separate attempts), else ``run N``, N its place
newest first.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..base.model import Entry, LoadProblem, RankDump, group_counts, plausible_time, time_range
from ..base.text import is_number, path_text
from ..base.words import count, ranks_text

CLOCK_SLACK_NS = 2 * 10**9  # how far apart two hosts' clocks may be, and still be one run's
RUN_GAP_NS = 10 * 60 * 10**9  # NCCL's default collective timeout: a run's ranks all dump within it
GENERIC_DESCS = ("", "undefined")  # descriptions that say nothing of which group a name is
DEFAULT_GROUP_NAMES = ("0",)
ARCHIVE_MARK = re.compile(r"\.(tar|tar\.gz|tgz|zip)!", re.IGNORECASE)  # inputs.py names members archive!member


@dataclass(frozen=True, slots=True)
class RankFile:
    """What a capture rank file (``fr_pid_rank_<rank>``) says of the process that wrote its rank's
    dump: the file's path, the rank, its host and pid, the process's start time and the run's identity
    (None where the file does not say)."""

    path: str
    rank: int
    host: str
    pid: int
    start: int | None = None
    run: str | None = None


@dataclass(slots=True)
class Run:
    """The dumps of one run of the job: by rank, the newest of each process, and the older snapshots
    left out for them; where they sit, and the first and last time they recorded."""

    name: str
    dumps: dict[int, RankDump]
    older: list[tuple[RankDump, RankDump]] = field(default_factory=list)  # (older snapshot, the dump kept)
    rank_files: list[RankFile] = field(default_factory=list)
    folders: tuple[str, ...] = ()
    span: tuple[int, int] | None = None

    @property
    def ranks(self) -> list[int]:
        return sorted(self.dumps)

    @property
    def files(self) -> list[str]:
        """Every dump file of the run: those used, then the older snapshots."""
        return [self.dumps[rank].path for rank in self.ranks] + [older.path for older, _ in self.older]

    def info(self) -> RunInfo:
        return RunInfo(self.name, tuple(self.ranks), tuple(self.files), self.folders, self.span)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What is shown of a run: its name, ranks, dump files, folders and time span (None: unknown)."""

    name: str
    ranks: tuple[int, ...]
    files: tuple[str, ...]
    folders: tuple[str, ...]
    span: tuple[int, int] | None

    @property
    def when(self) -> str:
        """When it last recorded, to the minute (UTC), or ``time unknown``."""
        if self.span is None:
            return "time unknown"
        return datetime.fromtimestamp(self.span[1] / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


@dataclass(slots=True)
class _Seen:
    """One dump as the runs are told apart by: where it sits, when, which process and run it is of."""

    dump: RankDump
    folder: str
    last: int  # the last time it recorded, whatever its clock (-1: none): what tells the newest
    span: tuple[int, int] | None  # plausible wall-clock times only
    began: int | None  # its process's first op, where its buffer still holds it
    host: str | None
    rank_file: RankFile | None
    descs: dict[str, str]  # group name -> its description, where it says one
    world: int | None  # the world's size, where pg_config lists the default group's ranks


@dataclass(slots=True)
class _Building:
    """A run as dumps join it."""

    dumps: dict[int, _Seen] = field(default_factory=dict)
    older: list[tuple[_Seen, _Seen]] = field(default_factory=list)
    folders: set[str] = field(default_factory=set)
    span: tuple[int, int] | None = None
    began: int | None = None
    identity: str | None = None
    descs: dict[str, str] = field(default_factory=dict)
    world: int | None = None


def find_runs(dumps: list[RankDump], rank_files: list[RankFile] | None = None, by_folder: bool = True) -> list[Run]:
    """The separate runs among ``dumps`` (with the capture helper's ``rank_files`` beside them), newest
    first; every dump is in exactly one run. ``by_folder``: runs whose dumps alone sit in a folder are
    named after it (else, and where that is not unique, ``run N``)."""
    seen = _attach_rank_files([_see(dump) for dump in dumps], rank_files or [])
    seen.sort(key=lambda s: (-s.last, s.dump.path))
    building: list[_Building] = []
    for each in seen:
        fitting = [(index, run) for index, run in enumerate(building) if _fits(run, each)]
        if not fitting:
            building.append(_Building())
            fitting = [(len(building) - 1, building[-1])]
        _, run = min(fitting, key=lambda item: _preference(item[0], item[1], each))
        _join(run, each)
    runs = [_finish(run) for run in building]
    _name(runs, by_folder)
    return runs


def folder_of(path: str) -> str:
    """The folder a dump sits in; for an archive's member (``dumps.tar.gz!job/rank_0``), the archive's
    own folder of it (``dumps.tar.gz!job``)."""
    mark = ARCHIVE_MARK.search(path)
    if mark is not None:
        archive, member = path[: mark.end() - 1], path[mark.end() :]
        inside = posixpath.dirname(member)
        return f"{archive}!{inside}" if inside else archive
    return os.path.dirname(path)


def choose_run(runs: list[Run], wanted: str) -> Run | None:
    """The run ``wanted`` names: by its name, by its place newest first (``2``), or by its folder."""
    for run in runs:
        if run.name == wanted:
            return run
    if is_number(wanted) and 1 <= int(wanted) <= len(runs):
        return runs[int(wanted) - 1]
    folder = os.path.normpath(wanted)
    matches = [run for run in runs if folder in run.folders]
    return matches[0] if len(matches) == 1 else None


def run_argument(runs: list[Run] | list[RunInfo], index: int) -> str:
    """What to give ``--run`` to pick ``runs[index]``: its name where a shell takes it as is, else its
    place (``2``)."""
    name = runs[index].name
    if re.fullmatch(r"[\w.@+-]{1,64}", name) and not is_number(name) and not name.startswith("-"):
        return name
    return str(index + 1)


def _see(dump: RankDump) -> _Seen:
    span = dump.time_range if dump.time_range is not None else time_range(dump.entries)
    last = span[1] if span is not None else -1
    if span is not None and (plausible_time(span[0]) is None or plausible_time(span[1]) is None):
        span = None  # a steady clock, or times of no date: nothing to compare with other dumps
    began = span[0] if span is not None and dump.entries and dump.entries[0].record_id == 0 else None
    counts = dump.group_counts if dump.group_counts is not None else group_counts(dump.entries)
    descs = {name: desc for (name, desc), _ in sorted(counts.items(), key=lambda item: item[1])
             if desc not in GENERIC_DESCS}  # fmt: skip
    world = None
    for name, config in dump.pg_config.items():
        if config.desc and config.desc not in GENERIC_DESCS:
            descs.setdefault(name, config.desc)
        # a claim that leaves out the rank's own self is no word on its world (a broken or forged config)
        if (name in DEFAULT_GROUP_NAMES or config.desc == "default_pg") and config.ranks and dump.rank in config.ranks:
            world = max(config.ranks) + 1
    return _Seen(dump, folder_of(dump.path), last, span, began, dump.host, None, descs, world)


def _attach_rank_files(seen: list[_Seen], rank_files: list[RankFile]) -> list[_Seen]:
    """Give each rank file to the newest dump of its rank in its folder: each run's ranks write theirs
    over the last one's, so a file left there is the newest run's."""
    newest: dict[tuple[str, int], _Seen] = {}
    for each in seen:
        key = (each.folder, each.dump.rank)
        other = newest.get(key)
        if other is None or each.last > other.last:
            newest[key] = each
    for rank_file in rank_files:
        owner = newest.get((folder_of(rank_file.path), rank_file.rank))
        if owner is not None:
            owner.rank_file = rank_file
            owner.host = owner.host or rank_file.host
    return seen


def _fits(run: _Building, each: _Seen) -> bool:
    """Whether ``each`` can be of ``run`` (the rules, in the module's order)."""
    identity = each.rank_file.run if each.rank_file else None
    if identity and run.identity:
        return identity == run.identity
    other = run.dumps.get(each.dump.rank)
    if other is not None:
        return same_process(each, other)
    if each.world is not None and run.world is not None and each.world != run.world:
        return False
    if any(run.descs.get(name, desc) != desc for name, desc in each.descs.items()):
        return False
    return _near(run, each)


def _near(run: _Building, each: _Seen) -> bool:
    """Whether ``each`` lies close enough in time to ``run`` (rule 4); unknown times always do."""
    if each.span is None or run.span is None:
        return True
    if run.began is not None and each.span[1] + CLOCK_SLACK_NS < run.began:
        return False
    if each.began is not None and run.span[1] + CLOCK_SLACK_NS < each.began:
        return False
    return max(run.span[0] - each.span[1], each.span[0] - run.span[1]) <= RUN_GAP_NS


def same_process(older: _Seen, newer: _Seen) -> bool:
    """Whether two dumps of one rank are of one process: what the capture helper says where it says it,
    else their hosts, else whether their entries agree as far as both reach (periodic snapshots), or
    they are two recorders' (gloo and NCCL: no op of one backend in common) of the same time."""
    mine, theirs = older.rank_file, newer.rank_file
    if mine is not None and theirs is not None:
        return (mine.host, mine.pid, mine.start) == (theirs.host, theirs.pid, theirs.start)
    if older.host and newer.host and older.host != newer.host:
        return False
    if _agree(older.dump.entries, newer.dump.entries):
        return True
    return _two_recorders(older, newer)


def _entry_key(entry: Entry) -> tuple[object, ...]:
    # what a snapshot of the same process repeats exactly (a state may move on: not compared)
    return (entry.record_id, entry.time_created_ns, entry.group_name, entry.collective_seq, entry.op)


def _agree(older: Sequence[Entry], newer: Sequence[Entry]) -> bool:
    """Whether ``older``'s entries are ``newer``'s as far as ``newer``'s buffer reaches back (an older
    snapshot with no entry agrees with anything; one whose every entry wrapped away cannot tell)."""
    if not older:
        return True
    if not newer:
        return False
    first = newer[0].record_id
    kept = [entry for entry in older if entry.record_id >= first]
    if not kept:
        return False
    by_record = {entry.record_id: entry for entry in newer}
    return all(
        (match := by_record.get(entry.record_id)) is not None and _entry_key(match) == _entry_key(entry)
        for entry in kept
    )


def _two_recorders(one: _Seen, other: _Seen) -> bool:
    backends = {entry.backend for entry in one.dump.entries}
    theirs = {entry.backend for entry in other.dump.entries}
    if not backends or not theirs or backends & theirs or one.folder != other.folder:
        return False
    if one.span is None or other.span is None:
        return True
    return max(one.span[0] - other.span[1], other.span[0] - one.span[1]) <= CLOCK_SLACK_NS


def _preference(index: int, run: _Building, each: _Seen) -> tuple[bool, bool, int, int]:
    """How well ``each`` suits a ``run`` it fits, smaller better: the run holds its process (a run that
    has its rank and fits it does), then holds its folder, then is nearest in time, then newest."""
    gap = 0
    if each.span is not None and run.span is not None:
        gap = max(0, run.span[0] - each.span[1], each.span[0] - run.span[1])
    return (each.dump.rank not in run.dumps, each.folder not in run.folders, gap, index)


def _join(run: _Building, each: _Seen) -> None:
    rank = each.dump.rank
    kept = run.dumps.get(rank)
    if kept is not None:  # an older snapshot of the process whose dump the run has (newest first)
        run.older.append((each, kept))
    else:
        run.dumps[rank] = each
    run.folders.add(each.folder)
    if each.span is not None:
        low, high = run.span if run.span is not None else each.span
        run.span = (min(low, each.span[0]), max(high, each.span[1]))
    if each.began is not None:
        run.began = each.began if run.began is None else min(run.began, each.began)
    if each.rank_file is not None and each.rank_file.run:
        run.identity = run.identity or each.rank_file.run
    for name, desc in each.descs.items():
        run.descs.setdefault(name, desc)
    run.world = run.world if run.world is not None else each.world


def _finish(run: _Building) -> Run:
    older = [(old.dump, kept.dump) for old, kept in run.older]
    rank_files = [s.rank_file for s in [*run.dumps.values(), *(old for old, _ in run.older)] if s.rank_file]
    dumps = {rank: run.dumps[rank].dump for rank in sorted(run.dumps)}
    return Run("", dumps, older, rank_files, tuple(sorted(run.folders)), run.span)


def _name(runs: list[Run], by_folder: bool) -> None:
    """Name each run after the folder that holds its dumps and no other run's, else ``run N``."""
    names = [_folder_name(run, runs) if by_folder else None for run in runs]
    taken = [name for name in names if name]
    for place, (run, name) in enumerate(zip(runs, names, strict=True), start=1):
        unique = name is not None and taken.count(name) == 1 and not re.fullmatch(r"run \d+", name)
        run.name = name if unique and name else f"run {place}"


def _folder_name(run: Run, runs: list[Run]) -> str | None:
    """The last part of the folder holding all of ``run``'s dumps, if no other run's lie in or under it."""
    try:
        common = run.folders[0] if len(run.folders) == 1 else os.path.commonpath(list(run.folders))
    except ValueError:  # absolute and relative paths: no folder holds both
        return None
    if not common:  # the current folder: no name to give
        return None
    others = [folder for other in runs if other is not run for folder in other.folders]
    if any(folder == common or folder.startswith(common.rstrip("/") + "/") for folder in others):
        return None
    inside = common.rsplit("!", 1)[-1] if "!" in common and ARCHIVE_MARK.search(common) else common
    name = os.path.basename(inside.rstrip("/")) or os.path.basename(common.split("!", 1)[0])
    return path_text(name) or None


FILES_NAMED = 3  # files a note names, for a run that shares its folder with another


def left_out_notes(runs: list[Run], chosen: Run, name_files: bool = True) -> list[LoadProblem]:
    """One note per run other than ``chosen``: where it is, what it holds, and how to pick it instead.
    ``name_files``: a run sharing its folder with another is told by its files' names."""
    notes = []
    for index, run in enumerate(runs):
        if run is chosen:
            continue
        shared = any(folder in other.folders for other in runs if other is not run for folder in run.folders)
        what = f"{count(len(run.files), 'dump')} of {ranks_text(run.ranks)}"
        if shared and name_files:
            names = [os.path.basename(path) for path in run.files]
            more = f" and {len(names) - FILES_NAMED} more" if len(names) > FILES_NAMED else ""
            what += ": " + ", ".join(names[:FILES_NAMED]) + more + ";"
        else:
            what += ","
        pick = run_argument(runs, index)
        reason = f"another run ({what} last {run.info().when}), left out; pick it with --run {pick}"
        notes.append(LoadProblem(_where(run), reason, fatal=False))
    return notes


def no_such_run(runs: list[Run], wanted: str) -> LoadProblem:
    """The error for a ``--run`` that names none of ``runs``: what it could name."""
    names = ", ".join(run.name for run in runs[:12]) + (f" and {len(runs) - 12} more" if len(runs) > 12 else "")
    held = f"the inputs hold {count(len(runs), 'run')}: {names} (newest first)" if runs else "the inputs hold no dump"
    return LoadProblem(f"--run {wanted}", f"no such run; {held}; give a name, a number (1: the newest) or a folder")


def keeps_beside(chosen: Run, runs: list[Run]) -> Callable[[str], bool]:
    """Whether a file found beside the dumps (a stack snapshot, a log, a ``.ended`` or rank file) may be
    of ``chosen``: a ``.ended`` or rank file goes with the dump it belongs to; anything else is kept
    when it sits in one of ``chosen``'s folders, or in a folder holding no run's dumps."""
    owner = {path: run for run in runs for path in run.files}
    owner.update({rank_file.path: run for run in runs for rank_file in run.rank_files})
    folders = {folder for run in runs for folder in run.folders}

    def keeps(path: str) -> bool:
        path = path_text(path)
        run = owner.get(path) or owner.get(path.removesuffix(".ended"))
        if run is not None:
            return run is chosen
        folder = folder_of(path)
        return folder in chosen.folders or folder not in folders

    return keeps


def which_run(runs: list[RunInfo], name: str) -> str:
    """Which of ``runs`` was read, in words: ``Run skip, the newest of the 3 runs in these dumps; the
    others are left out (--run picks one)``."""
    names = [info.name for info in runs]
    place = names.index(name) + 1 if name in names else 0
    which = "the newest" if place == 1 else f"the {_ordinal(place)} newest"
    return f"Run {name}, {which} of the {len(runs)} runs in these dumps; the others are left out (--run picks one)"


def _ordinal(number: int) -> str:
    """``2nd``, ``11th``, ``23rd``."""
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _where(run: Run) -> str:
    """A run's place, to name in a note: its one folder, else the folder holding all of them."""
    if len(run.folders) == 1:
        return run.folders[0] or "."
    try:
        return os.path.commonpath(list(run.folders)) or "."
    except ValueError:
        return run.folders[0] or "."
