"""Make a job safe to attach to a public issue: no string of a dump reaches an output unless it is one
of PyTorch's own words.

Every string a dump holds is either a word PyTorch itself writes (op names such as ``all_reduce``,
backends, dtypes, group descriptions such as ``tp`` or ``default_pg``, function names and file names of
torch's own code) and stays, or it becomes a stable placeholder: ``host1``, ``<dir3>`` for directories
(in any OS's form), ``group2`` for descriptions, ``pg4`` for group names that are not numbers,
``thread1``, ``fn3`` and ``file2.py`` for the training script's functions and files (``keep_names``
keeps those two), ``op1``, ``dtype1``, ``backend1``. Dump files are named by their rank only. The same
input always gets the same placeholders. It runs on the dumps as read, before groups are resolved, so
that everything made from them (tracks, findings, messages, the report) is made from redacted text.

Redaction is a view: it changes what is shown, never what is known. The stack snapshots, logs and the
capture helper's files beside the dumps are read as always and redacted with the same placeholders
(``redact_evidence``): one value always becomes one placeholder, so every comparison the diagnosis makes
(the same frame in two snapshots, the same group on two ranks) comes out as it does unredacted, and the
verdict with it.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..base.model import (
    LOG_CHILD_FAILED,
    LOG_WATCHDOG_TIMEOUT,
    Entry,
    Frame,
    GroupConfig,
    LoadProblem,
    LogEvent,
    RankDump,
    StackSnapshot,
    ThreadStack,
    group_counts,
)
from ..base.text import is_number
from .columns import EntryRows, Tables, first_uses
from .files import parse_dump_name

KNOWN_OPS = {
    "allreduce", "all_reduce", "broadcast", "reduce", "allgather", "all_gather", "all_gather_into_tensor",
    "allgather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "reducescatter", "all_to_all",
    "all_to_all_single", "alltoall", "alltoall_base", "barrier", "monitored_barrier", "gather", "scatter",
    "send", "recv", "isend", "irecv", "recv_any_source", "recvanysource", "coalesced", "allreduce_sparse",
}  # fmt: skip
KNOWN_BACKENDS = {"nccl", "gloo", "ucc", "mpi", "xccl", "hccl", "fake", "custom", "cpu", "cuda", "undefined"}
KNOWN_DTYPES = {
    "Float", "Double", "Half", "BFloat16", "Int", "Long", "Short", "Char", "Byte", "Bool", "ComplexFloat",
    "ComplexDouble", "ComplexHalf", "Float8_e4m3fn", "Float8_e5m2", "Float8_e4m3fnuz", "Float8_e5m2fnuz",
    "UInt16", "UInt32", "UInt64", "QInt8", "QUInt8", "QInt32", "Undefined",
}  # fmt: skip
KNOWN_DESCS = {
    "default_pg", "undefined", "tp", "pp", "dp", "ep", "cp", "sp", "mp", "fsdp", "ddp", "hsdp", "tensor",
    "pipeline", "data", "expert", "context", "sequence", "model", "world", "global", "intra_node", "inter_node",
    "dp_replicate", "dp_shard", "dp_cp", "tp_cp", "dp_shard_cp", "embedding", "position_embedding",
}  # fmt: skip
_TORCH_CODE = re.compile(r"(^|[/\\])(torch|torch_npu|apex|megatron|deepspeed)[/\\]")
_SPLIT = re.compile(r"[/\\]")
# Python's own library: lib/python3.11/..., not what was installed into it (site-packages, dist-packages)
_STDLIB = re.compile(r"[/\\]lib[/\\]python3(\.\d+)?[/\\](?!(site|dist)-packages[/\\])")


def public_code(path: str) -> str | None:
    """A frame's file in torch's code (or a library of the same kind) or Python's standard library, from
    its package down, with where it was installed left out; None for any other file."""
    torch = _TORCH_CODE.search(path)
    if torch is not None:
        return "<site-packages>/" + path[torch.start(2) :].replace("\\", "/")
    stdlib = _STDLIB.search(path)
    if stdlib is not None:
        return "<python>/" + path[stdlib.end() :].replace("\\", "/")
    return None


class Redactor:
    """Hands out one placeholder per distinct value of each kind, in order of first appearance."""

    def __init__(self, keep_names: bool = False) -> None:
        self.keep_names = keep_names
        self._given: dict[tuple[str, str], str] = {}
        self._frames: dict[Frame, Frame] = {}
        self._stacks: dict[tuple[Frame, ...], tuple[Frame, ...]] = {}
        self.paths: dict[str, str] = {}  # each input's path -> what is shown of it

    def placeholder(self, kind: str, value: str, form: str = "{kind}{number}") -> str:
        key = (kind, value)
        given = self._given.get(key)
        if given is None:
            number = sum(1 for k, _ in self._given if k == kind) + 1
            given = self._given[key] = form.format(kind=kind, number=number)
        return given

    def host(self, name: str) -> str:
        return self.placeholder("host", name)

    def directory(self, path: str) -> str:
        return self.placeholder("dir", path, "<{kind}{number}>")

    def path(self, path: str, torch_code: bool | None = None) -> str:
        """``/home/alice/train.py`` (or ``C:\\Users\\alice\\train.py``) to ``<dir1>/train.py``, the file
        name itself kept with ``keep_names``, else ``file1.py``. Code that is not the job's own stays
        readable from its package down, where it was installed said no more than that:
        ``<site-packages>/torch/distributed/distributed_c10d.py``, ``<python>/multiprocessing/process.py``."""
        public = public_code(path)
        if public is not None:
            return public
        parts = _SPLIT.split(path)
        directory, base = path[: len(path) - len(parts[-1])].rstrip("/\\"), parts[-1]
        keep = self.keep_names or (torch_code if torch_code is not None else bool(_TORCH_CODE.search(path)))
        if not keep and base not in ("<string>", "<unknown>", "?", ""):
            _, dot, extension = base.rpartition(".")
            suffix = f".{extension}" if dot and re.fullmatch(r"[A-Za-z0-9]{1,4}", extension) else ""
            base = self.placeholder("file", base, "{kind}{number}") + suffix
        return f"{self.directory(directory)}/{base}" if directory else base

    def stack(self, frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
        known = self._stacks.get(frames)
        if known is None:
            known = self._stacks[frames] = tuple(self._frame(f) for f in frames)
        return known

    def _frame(self, frame: Frame) -> Frame:
        known = self._frames.get(frame)
        if known is None:
            torch_code = public_code(frame.filename) is not None
            name = (
                frame.name
                if torch_code or self.keep_names or frame.name == "<module>"
                else (self.placeholder("fn", frame.name))
            )
            known = self._frames[frame] = Frame(name, self.path(frame.filename, torch_code), frame.line)
        return known

    def op(self, op: str) -> str:
        bare = op.lower().lstrip("_").removesuffix("_coalesced").removesuffix("_base")
        return op if bare in KNOWN_OPS or op.lower() == "coalesced" else self.placeholder("op", op)

    def backend(self, backend: str) -> str:
        return backend if not backend or backend.lower() in KNOWN_BACKENDS else self.placeholder("backend", backend)

    def dtype(self, dtype: str) -> str:
        return dtype if dtype in KNOWN_DTYPES else self.placeholder("dtype", dtype)

    def desc(self, desc: str) -> str:
        return desc if not desc or desc in KNOWN_DESCS else self.placeholder("group", desc)

    def group_name(self, name: str) -> str:
        return name if is_number(name) and len(name) < 12 else self.placeholder("pg", name)

    def thread(self, value: str) -> str:
        return value if not value or is_number(value) else self.placeholder("thread", value)

    def file(self, path: str) -> str:
        """A dump's path: ``<dumps>/rank_7``, its extension kept; a file of no rank, ``<dumps>/file1``."""
        parsed = parse_dump_name(path)
        suffix = ".json" if path.lower().endswith(".json") else ""
        if parsed is None:
            return "<dumps>/" + self.placeholder("input", path)
        return f"<dumps>/rank_{parsed.rank}{suffix}"


def redact_dumps(
    dumps: dict[int, RankDump],
    problems: list[LoadProblem],
    keep_names: bool = False,
    redactor: Redactor | None = None,
) -> list[LoadProblem]:
    """Redact the dumps in place (paths, hosts, every string of every entry and of their configs) and
    return the problems with their paths, and any path quoted in them, redacted. ``redactor``: the one
    whose placeholders the evidence beside the dumps gets too (``redact_evidence``). Entries made from
    columns stay so, their ids into the job's tables redacted (``EntryRows.with_tables``): a job of
    thousands of ranks is never held as one object per entry."""
    redactor = redactor if redactor is not None else Redactor(keep_names)
    paths = redactor.paths
    redact = _value_redactions(redactor)
    # the tables that ranks' entries made from columns index (by their id): the ids of each met so far
    tables_met: dict[int, tuple[Tables, dict[str, set[int]]]] = {}
    from_columns: list[RankDump] = []
    for rank in sorted(dumps):
        dump = dumps[rank]
        paths[dump.path] = dump.path = redactor.file(dump.path)
        if dump.host:
            dump.host = redactor.host(dump.host)
        dump.comm_lib_version = dump.comm_lib_version if re.fullmatch(r"[\d.]*", dump.comm_lib_version) else ""
        dump.pg_config = {
            redactor.group_name(key): GroupConfig(
                redactor.group_name(c.name), redactor.desc(c.desc), c.ranks, c.claimed
            )
            for key, c in dump.pg_config.items()
        }
        dump.pg_status = {redactor.group_name(key): value for key, value in dump.pg_status.items()}
        rows = dump.entries
        if isinstance(rows, EntryRows) and rows.tables is not None:  # made from columns: only new values met
            met = tables_met.setdefault(id(rows.tables), (rows.tables, {name: set() for name in _READ_FROM}))[1]
            for entry in rows.rows(_rows_first_using(rows, met)):
                _entry(redact, entry)
            from_columns.append(dump)
        else:
            dump.entries = [_entry(redact, entry) for entry in rows]
            dump.group_counts = group_counts(dump.entries)
    redacted = {key: _redacted_tables(redact, tables, met) for key, (tables, met) in tables_met.items()}
    for dump in from_columns:
        rows = dump.entries
        assert isinstance(rows, EntryRows) and rows.tables is not None
        dump.entries = rows.with_tables(redacted[id(rows.tables)])
        dump.group_counts = _redacted_counts(redact, dump)
    return redact_problems(problems, redactor)


def _rows_first_using(rows: EntryRows, met: dict[str, set[int]]) -> list[int]:
    """The rows of ``rows`` where an id of a table in ``_READ_FROM`` first appears that is not in ``met`` (by
    table), ascending; ``met`` takes those ids. Redacting the entries at these rows, in this order, meets
    the values that redacting every entry would, in the same order (so each gets the same placeholder):
    an entry whose ids were all met before holds no value not met before."""
    wanted: set[int] = set()
    for table, (fields, _) in _READ_FROM.items():
        seen = met[table]
        first: dict[int, int] = {}  # id -> the row it first appears at
        for field in fields:
            column = rows.column(field)
            assert column is not None  # a field read from a table: its ids are a column
            new = set(first_uses(column)) - seen
            if new:
                ids = array("I", column)
                for id_ in new:
                    row = ids.index(id_)
                    first[id_] = min(first.get(id_, row), row)
        seen.update(first)
        wanted.update(first.values())
    return sorted(wanted)


def _redacted_tables(redact: ValueRedactions, tables: Tables, met: dict[str, set[int]]) -> Tables:
    """``tables`` with each value redacted as ``_entry`` redacts it, for the ids met (every value meets the
    redactor first through an entry, in the order of the entries); a value no entry read is left out."""
    redacted = dict(tables)
    for name, (_, left_out) in _READ_FROM.items():
        seen, value_of = met[name], redact[name]
        redacted[name] = [value_of(value) if index in seen else left_out for index, value in enumerate(tables[name])]
    return redacted


def _redacted_counts(redact: ValueRedactions, dump: RankDump) -> dict[tuple[str, str], int]:
    """``dump.group_counts`` of its entries redacted (read from its columns where the reader counted them)."""
    if dump.group_counts is None:
        return group_counts(dump.entries)
    counts: Counter[tuple[str, str]] = Counter()
    for group, count in dump.group_counts.items():
        counts[redact["groups"](group)] += count
    return dict(counts)


def redact_problems(problems: list[LoadProblem], redactor: Redactor) -> list[LoadProblem]:
    """The problems with their paths, and any input's path quoted in them, as ``redactor`` shows them."""
    redacted = []
    for problem in problems:
        path = redactor.paths.get(problem.path) or redactor.file(problem.path)
        reason = problem.reason
        for original, placeholder in redactor.paths.items():
            reason = reason.replace(original, placeholder)
        redacted.append(replace(problem, path=path, reason=_reason(reason)))
    return redacted


# The first words of a log line or an ending that are PyTorch's or Python's own, kept: the kind of
# exception (``RuntimeError``, ``torch.distributed.DistBackendError``) or the signal that ended a rank.
_EXCEPTION_CLASS = re.compile(r"(?:[A-Za-z_][\w]{0,40}\.){0,4}[A-Z]\w{0,40}(?:Error|Exception|Interrupt|Exit)\b")
_OWN_WORDS = re.compile(r"(exit|running|signal SIG[A-Z]{2,8})$")
_DETAILS_KEPT = {"seq", "op", "timeout_ms", "ran_ms", "exitcode", "signal", "error"}
LEFT_OUT = "…"
# The tables whose values redaction changes: the fields of ``Entry`` read from each (by their ids), and what
# stands for a value of the table that no entry holds
_READ_FROM: dict[str, tuple[tuple[str, ...], Any]] = {
    "groups": (("group_name",), (LEFT_OUT, LEFT_OUT)), "ops": (("op",), (LEFT_OUT, LEFT_OUT)),
    "dtypes": (("input_dtypes", "output_dtypes"), ()), "threads": (("thread_id",), (LEFT_OUT, LEFT_OUT)),
    "stacks": (("frames",), ()),
}  # fmt: skip
WATCHDOG_WORDS = "Watchdog caught collective operation timeout"


def redact_line(line: str) -> str:
    """A log line or an ending with its text left out: only the exception's class (``exception:
    RuntimeError: …``), or the words PyTorch and the capture helper write themselves, stay."""
    prefix = ""
    if line.startswith("exception: "):
        prefix, line = "exception: ", line.removeprefix("exception: ")
    if _OWN_WORDS.fullmatch(line):
        return prefix + line
    match = _EXCEPTION_CLASS.match(line)
    kept = match.group(0) if match is not None and not line[match.end() : match.end() + 1].isalnum() else ""
    return prefix + (f"{kept}: {LEFT_OUT}" if kept else LEFT_OUT)


def redact_evidence(
    redactor: Redactor,
    snapshots: dict[int, list[StackSnapshot]],
    events: list[LogEvent],
    endings: dict[int, str],
    processes: dict[int, tuple[str, int]],
) -> None:
    """Redact, in place, what lies beside the dumps with the dumps' placeholders: snapshots' frames and
    sources, log lines (the exception's class and PyTorch's own numbers kept), how each rank ended, and
    the capture helper's hosts. What they say (who waits where, who failed first) is kept whole."""
    for taken in snapshots.values():
        for snapshot in taken:
            snapshot.source = _source(redactor, snapshot.source, "stacks")
            snapshot.threads = [
                ThreadStack(redactor.thread(t.name), redactor.stack(t.frames), t.current) for t in snapshot.threads
            ]
    for event in events:
        event.line = _log_line(event)
        event.source = _source(redactor, event.source, "log")
        event.details = {key: value for key, value in event.details.items() if key in _DETAILS_KEPT}
        if "op" in event.details:
            event.details["op"] = redactor.op(event.details["op"])
    for rank, ending in endings.items():
        endings[rank] = redact_line(ending)
    for rank, (host, pid) in processes.items():
        processes[rank] = (redactor.host(host), pid)


def _log_line(event: LogEvent) -> str:
    """A log event's line as shown redacted: the watchdog's own sentence and torchrun's table (read into
    fr2perfetto's words) stay; any other line keeps only the exception's class."""
    if event.kind == LOG_CHILD_FAILED:
        return event.line
    if event.kind == LOG_WATCHDOG_TIMEOUT and (start := event.line.find(WATCHDOG_WORDS)) >= 0:
        return event.line[start:]
    return redact_line(event.line)


def _source(redactor: Redactor, source: str, kind: str) -> str:
    """A snapshot's or log line's source, ``path`` or ``path:line``: the file as ``<dumps>/stacks2``."""
    path, colon, line = source.rpartition(":")
    if not (colon and is_number(line)):
        path, line = source, ""
    shown = redactor.paths.get(path) or "<dumps>/" + redactor.placeholder(kind, path)
    return f"{shown}:{line}" if line else shown


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|(?<=the pickle asks for )[^;]+")


def _reason(reason: str) -> str:
    """A problem's reason without what it quotes from the input: a version, a member's name, the class
    a pickle asks for (the reason's own words say what was wrong)."""
    return _QUOTED.sub("'…'", reason)


# table name -> how one of its values is redacted (``_value_redactions``)
ValueRedactions = dict[str, Callable[[Any], Any]]


def _value_redactions(redactor: Redactor) -> ValueRedactions:
    """How a value of each table in ``_READ_FROM`` is redacted: the one definition of what ``_entry`` does to
    the fields read from it and of what the tables get (``_redacted_tables``), so that both give each value
    the same placeholder, met in the same order."""
    return {
        "groups": lambda group: (redactor.group_name(group[0]), redactor.desc(group[1])),
        "ops": lambda op: (redactor.backend(op[0]), redactor.op(op[1])),
        "dtypes": lambda dtypes: tuple(map(redactor.dtype, dtypes)),
        "threads": lambda thread: (redactor.thread(thread[0]), redactor.thread(thread[1])),
        "stacks": lambda frames: redactor.stack(frames) if frames else frames,
    }


def _entry(redact: ValueRedactions, entry: Entry) -> Entry:
    """``entry`` redacted; its values met group, op, input and output dtypes, thread, stack, in that order."""
    group_name, group_desc = redact["groups"]((entry.group_name, entry.group_desc))
    backend, op = redact["ops"]((entry.backend, entry.op))
    input_dtypes, output_dtypes = redact["dtypes"](entry.input_dtypes), redact["dtypes"](entry.output_dtypes)
    thread_id, thread_name = redact["threads"]((entry.thread_id, entry.thread_name))
    return entry._replace(
        group_name=group_name,
        group_desc=group_desc,
        backend=backend,
        op=op,
        input_dtypes=input_dtypes,
        output_dtypes=output_dtypes,
        thread_id=thread_id,
        thread_name=thread_name,
        frames=redact["stacks"](entry.frames),
    )
