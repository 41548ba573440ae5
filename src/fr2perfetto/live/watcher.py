"""The watch itself: poll a running job, say what changes, and when it stands still for the stall, take the
evidence and make the verdict and the trace of it. The one module here that decides when to act: the
requests and files are ``sources``' and ``evidence``', what the answers mean ``progress``'.

A round, every ``every`` seconds: ask each rank where it stands (at most ``in_flight`` requests at once,
each within ``timeout``; a rank still being asked is not asked again), update the progress, report it.
Then, in this order: the job ended (every rank's server went away, after it had answered; or, in a folder,
every rank's ``.ended`` file says how it ended, or nothing new was written there for a long while), or it
stands still (no rank moved for ``stall`` seconds): the evidence, twice ``gap`` seconds apart, into a
folder of its own, analysed there as ``fr2perfetto analyze`` would (``api.load`` and ``api.analyze``),
the trace written beside it. Without ``keep_going`` the watch ends there; with it, the next hang is
caught once the job has moved again.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import api
from ..base.text import is_number
from ..base.words import count, ranks_text
from ..trigger import signal_ranks, trigger_dumps
from .evidence import REPORT, TRACE, Round, Taken, check_out, copy_into, folder_for, write_manifest, write_rounds
from .progress import Failure, Progress, Sample, Status
from .sources import (
    MAX_RESPONSE_BYTES,
    MAX_STACKS_BYTES,
    FolderSource,
    HttpSource,
    WatchError,
    parse_targets,
    start_http,
    workers_gone,
)

SILENCE_FLOOR = 30.0  # seconds without a new file before a watched folder's job is taken to have ended
CPU_SHARE = 0.1  # of one core, at most, that reading the ranks' answers takes on average
DUMP_WAIT = 10.0  # seconds given to ranks asked to dump (a capture helper, an NCCL debug pipe) to do so


@dataclass(frozen=True, slots=True)
class Settings:
    """How the watch runs: see ``fr2perfetto watch --help`` (all times in seconds)."""

    stall: float = 60.0
    every: float = 5.0
    timeout: float = 10.0
    wait: float = 120.0
    out: str | None = None
    keep_going: bool = False
    in_flight: int = 4
    rounds: int = 2
    gap: float = 3.0
    max_bytes: int = MAX_RESPONSE_BYTES


@dataclass(frozen=True, slots=True)
class Hang:
    """A hang caught: its verdict (None where no rank's Flight Recorder could be taken), the folder of its
    evidence, the report and the trace written there (None: not written), and what could not be done."""

    report: api.Report | None
    folder: str
    report_path: str | None
    trace_path: str | None
    stalled_for: float
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Outcome:
    """How the watch ended: its exit code (0: the job ended; 1: a hang caught, or a rank that ended on an
    error of its own), one line that says so, the hangs caught, and what the watch asked for."""

    code: int
    summary: str
    hangs: tuple[Hang, ...] = ()
    requests: int = 0
    rounds: int = 0
    seconds: float = 0.0
    ranks: int = 0


@dataclass(slots=True)
class _Clock:
    now: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep


@dataclass(slots=True)
class _Run:
    targets: list[str]
    settings: Settings
    clock: _Clock
    on_status: Callable[[Status], None]
    on_event: Callable[[str], None]
    on_hang: Callable[[Hang], None]
    hangs: list[Hang] = field(default_factory=list)


def is_folder(targets: list[str]) -> bool:
    """Whether the targets name a folder (one path, not an address)."""
    return len(targets) == 1 and "://" not in targets[0] and not is_number(targets[0].split("=", 1)[0])


def watch_job(
    targets: list[str],
    settings: Settings,
    *,
    on_status: Callable[[Status], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    on_hang: Callable[[Hang], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Watch the job at ``targets`` (the debug server's frontend address, its workers' addresses, or a
    folder it writes into) until it ends or, unless ``settings.keep_going``, a hang is caught.
    ``on_status`` after every round, ``on_event`` for what is said at once (a rank that stops answering),
    ``on_hang`` for each hang caught, with its verdict. ``WatchError`` for a target that cannot be watched."""
    if not targets:
        raise WatchError("nothing to watch: give the debug server's address, its workers', or a folder")
    if settings.out is not None:
        refused = check_out(settings.out)
        if refused is not None:
            raise WatchError(f"--out {settings.out}: {refused}")
    run = _Run(list(targets), settings, _Clock(clock, wall, sleep), on_status or (lambda _: None),
               on_event or (lambda _: None), on_hang or (lambda _: None))  # fmt: skip
    if is_folder(targets):
        return _watch_folder(run, targets[0])
    parse_targets(targets)  # a wrong address is said before anything is asked
    source = start_http(targets, timeout=settings.timeout, in_flight=settings.in_flight, wait=settings.wait,
                        clock=clock, sleep=sleep, said=run.on_event)  # fmt: skip
    try:
        return _watch_http(run, source)
    finally:
        source.close()


def _watch_http(run: _Run, source: HttpSource) -> Outcome:
    settings, clock = run.settings, run.clock
    source.learn_recorders()
    started = clock.now()
    progress = Progress(settings.stall, started)
    progress.known(list(source.workers))
    deadline = started + settings.wait
    caught: float | None = None  # the last progress when the last hang was caught
    rounds = 0
    stretched = False
    while True:
        began, cpu = clock.now(), time.process_time()
        answers = source.poll(max(settings.every, 0.2))
        rounds += 1
        now = clock.now()
        status = _observe(run, progress, now, answers)
        heard = progress.heard()
        if not heard and now >= deadline:
            silent = ", ".join(sorted({a.reason for a in answers.values() if isinstance(a, Failure)})) or "no answer"
            raise WatchError(f"{source.label}: no rank answered in {settings.wait:g} s ({silent}): the job never "
                             "started, or these are not its workers' addresses")  # fmt: skip
        gone = progress.gone()
        if heard and len(gone) == len(progress.ranks):
            return _ended(run, progress, now, started, rounds, source.requests)
        if status.stalled and progress.last_progress != caught:
            caught = progress.last_progress
            hang = _catch(run, progress, now, lambda folder: _take_http(run, source, folder))
            if not settings.keep_going:
                return _caught(run, hang, now, started, rounds, source.requests, len(progress.ranks))
            continue
        # a round every ``every`` seconds, or less often where reading the answers would take more than
        # CPU_SHARE of a core (thousands of entries on many ranks): the watch stays light beside the job
        period = max(settings.every, (time.process_time() - cpu) / CPU_SHARE)
        if period > settings.every * 1.5 and not stretched:
            stretched = True
            ranks = count(len(source.workers), "rank")
            run.on_event(f"asking every {period:.0f} s rather than every {settings.every:g} s, to use under "
                         f"{CPU_SHARE:.0%} of a core reading {ranks}' answers")  # fmt: skip
        clock.sleep(max(0.0, period - (clock.now() - began)))


def _watch_folder(run: _Run, folder: str) -> Outcome:
    settings, clock = run.settings, run.clock
    started = clock.now()
    deadline = started + settings.wait
    waiting_said = False
    while not os.path.isdir(folder):
        if clock.now() >= deadline:
            raise WatchError(f"{folder}: no such folder after {settings.wait:g} s (give the folder the debug "
                             "server's dump_dir, or the capture helper, writes into)")  # fmt: skip
        if not waiting_said:
            run.on_event(f"waiting for {folder} to be made")
            waiting_said = True
        clock.sleep(min(1.0, settings.every))
    source = FolderSource(folder, max_bytes=settings.max_bytes)
    source.poll(started)  # what is there already may be an earlier run's: only what is written from now on counts
    source.last_new = None
    source.recorded.clear()
    source.ranks.clear()
    source.endings.clear()
    source.workers.clear()
    progress = Progress(settings.stall, started)
    caught: float | None = None
    rounds = 0
    probed = 0.0  # how long the folder had been quiet when its workers were last asked whether they are gone
    while True:
        began = clock.now()
        answers = source.poll(began)
        rounds += 1
        now = clock.now()
        status = _observe(run, progress, now, answers)
        if source.last_new is None:
            if now >= deadline:
                raise WatchError(f"{folder}: nothing new was written there in {settings.wait:g} s: no job writes its "
                                 "debug server's snapshots (dump_dir) or the capture helper's dumps there")  # fmt: skip
        else:
            finished = source.finished()
            if finished is not None:
                return _finished(run, progress, finished, folder, now, started, rounds)
            quiet = now - source.last_new
            interval = source.interval() or settings.every
            probed = 0.0 if quiet < probed else probed  # a new file since: ask again after the next quiet spell
            gone = False
            # the debug server's workers, where its snapshots named them, say whether it is gone; else silence
            if source.workers and quiet >= probed + max(3 * interval, 6.0):
                probed = quiet
                gone = workers_gone(source.workers, settings.timeout)
            elif not source.workers:
                gone = quiet >= max(SILENCE_FLOOR, 4 * interval)
            if gone:
                return _folder_ended(run, progress, source, folder, now, started, rounds)
        if status.stalled and progress.last_progress != caught:
            # a job that ended and one that stands still look alike in a folder until its workers are asked:
            # its last stacks may have stood still for the stall before the next quiet spell's question
            if source.workers and source.last_new is not None and workers_gone(source.workers, settings.timeout):
                return _folder_ended(run, progress, source, folder, now, started, rounds)
            caught = progress.last_progress
            hang = _catch(run, progress, now, lambda out: _take_folder(run, source, out))
            if not settings.keep_going:
                return _caught(run, hang, now, started, rounds, 0, len(progress.ranks))
        clock.sleep(max(0.0, settings.every - (clock.now() - began)))


def _folder_ended(
    run: _Run, progress: Progress, source: FolderSource, folder: str, now: float, started: float, rounds: int
) -> Outcome:
    """A watched folder's job ended: nothing new was written there, and its workers went away (or, where its
    snapshots name none, nothing was written for long enough)."""
    quiet = now - (source.last_new or now)
    why = "its debug server's workers went away" if source.workers else "its writers stopped with it"
    summary = f"the job ended: nothing new was written into {folder} for {quiet:.0f} s ({why}); "
    return _outcome(run, 0, summary + _watched(progress, now, started), now, started, rounds, 0, len(progress.ranks))


def _observe(run: _Run, progress: Progress, now: float, answers: dict[int, Sample | Failure]) -> Status:
    for event in progress.observe(now, answers):
        run.on_event(event)
    status = progress.status(now)
    run.on_status(status)
    return status


_Take = Callable[[str], tuple[list[str], dict[str, object]]]  # evidence into a folder: (problems, notes)


def _catch(run: _Run, progress: Progress, now: float, take: _Take) -> Hang:
    """Take the evidence of a job that stands still into a new folder, analyse it, write the report and
    the trace beside it, and say so (``on_hang``)."""
    stalled_for = progress.since_progress(now) or 0.0
    problems: list[str] = []
    try:
        folder = folder_for(run.settings.out, len(run.hangs) + 1, run.clock.wall())
    except OSError as error:  # --out filled or taken meanwhile: the evidence matters more than where it goes
        problems.append(f"--out: {error}: the evidence went to a folder of its own instead")
        try:
            folder = folder_for(None, len(run.hangs) + 1, run.clock.wall())
        except OSError as again:
            raise WatchError(f"cannot make a folder for the evidence: {again}") from None
    run.on_event(f"no progress for {stalled_for:.0f} s: taking the evidence into {folder}")
    notes: dict[str, object] = {}
    try:
        taken, notes = take(folder)
        problems += taken
    except OSError as error:
        problems.append(f"the evidence could not all be written ({error.strerror or error})")
    notes.update(target=" ".join(run.targets), stall_seconds=run.settings.stall,
                 stalled_for_seconds=round(stalled_for, 1),
                 caught_at=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(run.clock.wall())))  # fmt: skip
    notes["problems"] = problems
    with contextlib.suppress(OSError, ValueError):
        write_manifest(folder, notes)
    report, report_path, trace_path = None, None, None
    try:
        job = api.load([folder], jobs=1)
    except api.NoDumps:
        problems.append("no rank's Flight Recorder could be taken: no verdict")
    else:
        report = api.analyze(job, inputs=[folder])
        try:
            report_path = os.path.join(folder, REPORT)
            with open(report_path, "w", encoding="utf-8") as handle:
                handle.write(report.to_json() + "\n")
        except OSError as error:
            problems.append(f"the report could not be written ({error.strerror or error})")
            report_path = None
        try:
            trace_path = os.path.join(folder, TRACE)
            api.write_trace(job, trace_path, report=report, jobs=1)
        except (OSError, ValueError) as error:
            problems.append(f"the trace could not be written ({error})")
            trace_path = None
    hang = Hang(report, folder, report_path, trace_path, stalled_for, tuple(problems))
    run.hangs.append(hang)
    run.on_hang(hang)
    return hang


def _gather(run: _Run, source: HttpSource) -> tuple[list[Round], list[str]]:
    """Every rank's Flight Recorder and stacks, ``rounds`` times ``gap`` seconds apart."""
    rounds: list[Round] = []
    for number in range(run.settings.rounds):
        if number:
            run.clock.sleep(run.settings.gap)
        moment = run.clock.wall()
        answers = source.gather()
        taken = {}
        for rank, answer in answers.items():
            failure = str(answer.failure) if answer.failure is not None else ""
            taken[rank] = Taken(dict(answer.recorders), answer.stacks, failure)
        for rank in source.workers:
            taken.setdefault(rank, Taken(failure="no answer in time"))
        rounds.append(Round(moment, taken))
    problems = []
    for rank in source.workers:
        failures = [r.ranks[rank].failure for r in rounds if r.ranks[rank].failure]
        if len(failures) == len(rounds):
            problems.append(f"rank {rank}: nothing could be taken ({failures[-1]})")
    return rounds, problems


def _notes(rounds: list[Round], written: list[str], workers: dict[int, object]) -> dict[str, object]:
    return {
        "workers": {str(rank): str(url) for rank, url in workers.items()},
        "rounds": [
            {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(r.time)),
             "answered": sorted(rank for rank, t in r.ranks.items() if not t.failure),
             "failed": {str(rank): t.failure for rank, t in sorted(r.ranks.items()) if t.failure}}
            for r in rounds
        ],
        "files": written,
    }  # fmt: skip


def _take_http(run: _Run, source: HttpSource, folder: str) -> tuple[list[str], dict[str, object]]:
    rounds, problems = _gather(run, source)
    written = write_rounds(folder, rounds)
    return problems, _notes(rounds, written, dict(source.workers))


def _take_folder(run: _Run, source: FolderSource, folder: str) -> tuple[list[str], dict[str, object]]:
    """The evidence of a job watched through a folder: from the debug server's workers its snapshots name
    where they answer; else by asking the ranks to dump as ``fr2perfetto trigger`` does (the capture
    helper's ranks on this host, NCCL's debug pipes) and copying what they write; and the folder's newest
    stack snapshots where no stacks came otherwise."""
    settings = run.settings
    problems: list[str] = []
    rounds: list[Round] = []
    written: list[str] = []
    if source.workers:
        http = HttpSource(source.workers, timeout=settings.timeout, in_flight=settings.in_flight,
                          max_bytes=settings.max_bytes)  # fmt: skip
        try:
            http.learn_recorders()
            rounds, problems = _gather(run, http)
        finally:
            http.close()
        written += write_rounds(folder, rounds)
    has_dumps = any(name.endswith(".json") and "_trace_rank_" in name for name in written)
    if not has_dumps:
        written += _ask_to_dump(run, source.folder, folder, problems)
    if not any(name.startswith("stacks_") for name in written):
        snapshots = sorted((p for p, seen in source.seen.items() if os.path.basename(p).startswith("stacks_")),
                           key=lambda p: source.seen[p].mtime_ns)[-2:]  # fmt: skip
        written += copy_into(folder, snapshots, MAX_STACKS_BYTES * 64)
    notes = _notes(rounds, written, dict(source.workers))
    notes["folder"] = source.folder
    return problems, notes


def _ask_to_dump(run: _Run, watched: str, folder: str, problems: list[str]) -> list[str]:
    """Ask the ranks to dump into the watched folder (twice, ``gap`` apart) and copy the dumps and stacks
    they write; where none answers, copy the newest dump of each rank there is."""
    settings = run.settings
    asked_at = run.clock.wall()
    asked: set[object] = set()
    for number in range(settings.rounds):
        if number:
            run.clock.sleep(settings.gap)
        asked.update(signal_ranks(watched, None, problems))
        asked.update(trigger_dumps(watched, problems))
    if asked:
        waited = 0.0
        while waited < DUMP_WAIT and len(_dumps(watched, asked_at)) < len(asked) // max(1, settings.rounds):
            run.clock.sleep(0.5)
            waited += 0.5
    fresh = _dumps(watched, asked_at)
    chosen = fresh or _newest_dumps(watched)
    if not chosen:
        problems.append(f"no Flight Recorder dump in {watched}, and no rank there could be asked for one")
        return []
    stacks = [p for p in _listing(watched) if os.path.basename(p).startswith("stacks_rank_")
              and _mtime(p) >= asked_at] if fresh else []  # fmt: skip
    endings = [p + ".ended" for p in chosen if os.path.exists(p + ".ended")]
    return copy_into(folder, [*chosen, *endings, *stacks], settings.max_bytes)


def _listing(folder: str) -> list[str]:
    try:
        return [os.path.join(folder, name) for name in sorted(os.listdir(folder))[:100_000]]
    except OSError:
        return []


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _dumps(folder: str, since: float) -> list[str]:
    from ..read.inputs import kind_of

    return [p for p in _listing(folder) if kind_of(os.path.basename(p)) == "dump" and _mtime(p) >= since]


def _newest_dumps(folder: str) -> list[str]:
    from ..read.files import parse_dump_name
    from ..read.inputs import kind_of

    newest: dict[int, str] = {}
    for path in _listing(folder):
        name = parse_dump_name(path)
        if kind_of(os.path.basename(path)) != "dump" or name is None:
            continue
        if name.rank not in newest or _mtime(path) > _mtime(newest[name.rank]):
            newest[name.rank] = path
    return list(newest.values())


def _watched(progress: Progress, now: float, started: float) -> str:
    ops = progress.ops()
    seen = f"{count(ops, 'op')} seen, " if ops else ""
    return f"{seen}{count(len(progress.ranks), 'rank')} watched for {_duration(now - started)}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _ended(run: _Run, progress: Progress, now: float, started: float, rounds: int, requests: int) -> Outcome:
    """Every rank's server went away: the job ended. When is said; how, only its exit status and logs say."""
    since = progress.since_progress(now)
    times = progress.gone_times()
    first = min(times.values()) if times else now
    late = sorted(rank for rank, at in times.items() if at - first > max(2 * run.settings.every, 5.0))
    after = f" {_duration(since)} after its last progress" if since is not None else ""
    went = f"its servers went away{after}"
    if late and len(late) < len(times):
        early = sorted(set(times) - set(late))
        went += f" ({ranks_text(early)} first, {_duration(max(times.values()) - first)} before the rest)"
    code = 1 if run.hangs else 0
    summary = f"the job ended: {went}; {_watched(progress, now, started)}" + _hangs_said(run)
    return _outcome(run, code, summary, now, started, rounds, requests, len(progress.ranks))


def _finished(run: _Run, progress: Progress, endings: dict[int, str], folder: str, now: float, started: float,
              rounds: int) -> Outcome:  # fmt: skip
    """Every rank's ``.ended`` file says how it ended: well (``exit``), or not."""
    bad = {rank: how for rank, how in endings.items() if how != "exit"}
    if not bad:
        summary = (f"the job finished: every rank's .ended file says exit; {_watched(progress, now, started)}"
                   + _hangs_said(run))  # fmt: skip
        return _outcome(run, 1 if run.hangs else 0, summary, now, started, rounds, 0, len(progress.ranks))
    rank, how = next(iter(bad.items()))
    more = f" (and {count(len(bad) - 1, 'other rank')})" if len(bad) > 1 else ""
    summary = (f"the job ended, not well: rank {rank}'s .ended file says {how[:200]}{more}; for the verdict: "
               f"fr2perfetto analyze {folder}")  # fmt: skip
    return _outcome(run, 1, summary + _hangs_said(run), now, started, rounds, 0, len(progress.ranks))


def _caught(run: _Run, hang: Hang, now: float, started: float, rounds: int, requests: int, ranks: int) -> Outcome:
    verdict = hang.report.summary if hang.report is not None else "no verdict (no Flight Recorder could be taken)"
    summary = f"hang caught after {_duration(hang.stalled_for)} without progress: {verdict}; evidence in {hang.folder}"
    return _outcome(run, 1, summary, now, started, rounds, requests, ranks)


def _hangs_said(run: _Run) -> str:
    if not run.hangs:
        return ""
    return f"; {count(len(run.hangs), 'hang')} caught before (evidence in {', '.join(h.folder for h in run.hangs)})"


def _outcome(run: _Run, code: int, summary: str, now: float, started: float, rounds: int, requests: int,
             ranks: int) -> Outcome:  # fmt: skip
    return Outcome(code, summary, tuple(run.hangs), requests, rounds, now - started, ranks)
