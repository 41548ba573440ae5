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
"""

from __future__ import annotations

import re
from dataclasses import replace

from ..base.model import Entry, Frame, GroupConfig, LoadProblem, RankDump, group_counts
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
        return name if name.isdigit() and len(name) < 12 else self.placeholder("pg", name)

    def thread(self, value: str) -> str:
        return value if not value or value.isdigit() else self.placeholder("thread", value)

    def file(self, path: str) -> str:
        """A dump's path: ``<dumps>/rank_7``, its extension kept; a file of no rank, ``<dumps>/file1``."""
        parsed = parse_dump_name(path)
        suffix = ".json" if path.lower().endswith(".json") else ""
        if parsed is None:
            return "<dumps>/" + self.placeholder("input", path)
        return f"<dumps>/rank_{parsed.rank}{suffix}"


def redact_dumps(
    dumps: dict[int, RankDump], problems: list[LoadProblem], keep_names: bool = False
) -> list[LoadProblem]:
    """Redact the dumps in place (paths, hosts, every string of every entry and of their configs) and
    return the problems with their paths, and any path quoted in them, redacted."""
    redactor = Redactor(keep_names)
    paths: dict[str, str] = {}
    for rank in sorted(dumps):
        dump = dumps[rank]
        paths[dump.path] = dump.path = redactor.file(dump.path)
        if dump.host:
            dump.host = redactor.host(dump.host)
        dump.comm_lib_version = dump.comm_lib_version if re.fullmatch(r"[\d.]*", dump.comm_lib_version) else ""
        dump.pg_config = {
            redactor.group_name(key): GroupConfig(redactor.group_name(c.name), redactor.desc(c.desc), c.ranks)
            for key, c in dump.pg_config.items()
        }
        dump.pg_status = {redactor.group_name(key): value for key, value in dump.pg_status.items()}
        dump.entries = [_entry(redactor, entry) for entry in dump.entries]
        dump.group_counts = group_counts(dump.entries)
    redacted = []
    for problem in problems:
        path = paths.get(problem.path) or redactor.file(problem.path)
        reason = problem.reason
        for original, placeholder in paths.items():
            reason = reason.replace(original, placeholder)
        redacted.append(replace(problem, path=path, reason=_reason(reason)))
    return redacted


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|(?<=the pickle asks for )[^;]+")


def _reason(reason: str) -> str:
    """A problem's reason without what it quotes from the input: a version, a member's name, the class
    a pickle asks for (the reason's own words say what was wrong)."""
    return _QUOTED.sub("'…'", reason)


def _entry(redactor: Redactor, entry: Entry) -> Entry:
    def dtypes(values: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(map(redactor.dtype, values))

    return entry._replace(
        group_name=redactor.group_name(entry.group_name),
        group_desc=redactor.desc(entry.group_desc),
        backend=redactor.backend(entry.backend),
        op=redactor.op(entry.op),
        input_dtypes=dtypes(entry.input_dtypes),
        output_dtypes=dtypes(entry.output_dtypes),
        thread_id=redactor.thread(entry.thread_id),
        thread_name=redactor.thread(entry.thread_name),
        frames=redactor.stack(entry.frames) if entry.frames else entry.frames,
    )
