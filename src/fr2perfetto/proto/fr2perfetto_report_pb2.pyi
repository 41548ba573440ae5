from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Report(_message.Message):
    __slots__ = ("schema_version", "tool_version", "verdict", "findings", "job", "input_problems", "stacks", "log_events", "next_steps", "runs")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    INPUT_PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    STACKS_FIELD_NUMBER: _ClassVar[int]
    LOG_EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEPS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    schema_version: str
    tool_version: str
    verdict: Verdict
    findings: _containers.RepeatedCompositeFieldContainer[Finding]
    job: JobSummary
    input_problems: _containers.RepeatedCompositeFieldContainer[InputProblem]
    stacks: _containers.RepeatedCompositeFieldContainer[RankStack]
    log_events: _containers.RepeatedCompositeFieldContainer[LogEvent]
    next_steps: _containers.RepeatedScalarFieldContainer[str]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    def __init__(self, schema_version: _Optional[str] = ..., tool_version: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, _Mapping]] = ..., findings: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ..., job: _Optional[_Union[JobSummary, _Mapping]] = ..., input_problems: _Optional[_Iterable[_Union[InputProblem, _Mapping]]] = ..., stacks: _Optional[_Iterable[_Union[RankStack, _Mapping]]] = ..., log_events: _Optional[_Iterable[_Union[LogEvent, _Mapping]]] = ..., next_steps: _Optional[_Iterable[str]] = ..., runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("name", "ranks", "files", "folders", "first_ns", "last_ns", "analysed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    FOLDERS_FIELD_NUMBER: _ClassVar[int]
    FIRST_NS_FIELD_NUMBER: _ClassVar[int]
    LAST_NS_FIELD_NUMBER: _ClassVar[int]
    ANALYSED_FIELD_NUMBER: _ClassVar[int]
    name: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    files: _containers.RepeatedScalarFieldContainer[str]
    folders: _containers.RepeatedScalarFieldContainer[str]
    first_ns: int
    last_ns: int
    analysed: bool
    def __init__(self, name: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., files: _Optional[_Iterable[str]] = ..., folders: _Optional[_Iterable[str]] = ..., first_ns: _Optional[int] = ..., last_ns: _Optional[int] = ..., analysed: _Optional[bool] = ...) -> None: ...

class RankStack(_message.Message):
    __slots__ = ("rank", "time_ns", "source", "thread", "where", "in_collective", "frames")
    RANK_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    THREAD_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    IN_COLLECTIVE_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    time_ns: int
    source: str
    thread: str
    where: Frame
    in_collective: bool
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    def __init__(self, rank: _Optional[int] = ..., time_ns: _Optional[int] = ..., source: _Optional[str] = ..., thread: _Optional[str] = ..., where: _Optional[_Union[Frame, _Mapping]] = ..., in_collective: _Optional[bool] = ..., frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ...) -> None: ...

class LogEvent(_message.Message):
    __slots__ = ("rank", "time_ns", "kind", "line", "source", "details")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RANK_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    time_ns: int
    kind: str
    line: str
    source: str
    details: _containers.ScalarMap[str, str]
    def __init__(self, rank: _Optional[int] = ..., time_ns: _Optional[int] = ..., kind: _Optional[str] = ..., line: _Optional[str] = ..., source: _Optional[str] = ..., details: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("status", "culprit_ranks", "category", "summary", "evidence")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CULPRIT_RANKS_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    status: str
    culprit_ranks: _containers.RepeatedScalarFieldContainer[int]
    category: str
    summary: str
    evidence: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[str] = ..., culprit_ranks: _Optional[_Iterable[int]] = ..., category: _Optional[str] = ..., summary: _Optional[str] = ..., evidence: _Optional[_Iterable[str]] = ...) -> None: ...

class Group(_message.Message):
    __slots__ = ("name", "desc", "members")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    desc: str
    members: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., desc: _Optional[str] = ..., members: _Optional[_Iterable[int]] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("name", "filename", "line")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    name: str
    filename: str
    line: int
    def __init__(self, name: _Optional[str] = ..., filename: _Optional[str] = ..., line: _Optional[int] = ...) -> None: ...

class Finding(_message.Message):
    __slots__ = ("kind", "group", "seq", "op", "ranks", "culprit_ranks", "evidence", "culprit_frames", "summary", "time_ns", "stacks", "lag_ns")
    KIND_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    CULPRIT_RANKS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    CULPRIT_FRAMES_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    TIME_NS_FIELD_NUMBER: _ClassVar[int]
    STACKS_FIELD_NUMBER: _ClassVar[int]
    LAG_NS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    group: Group
    seq: int
    op: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    culprit_ranks: _containers.RepeatedScalarFieldContainer[int]
    evidence: _containers.RepeatedScalarFieldContainer[str]
    culprit_frames: _containers.RepeatedCompositeFieldContainer[Frame]
    summary: str
    time_ns: int
    stacks: _containers.RepeatedCompositeFieldContainer[CulpritStack]
    lag_ns: int
    def __init__(self, kind: _Optional[str] = ..., group: _Optional[_Union[Group, _Mapping]] = ..., seq: _Optional[int] = ..., op: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., culprit_ranks: _Optional[_Iterable[int]] = ..., evidence: _Optional[_Iterable[str]] = ..., culprit_frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ..., summary: _Optional[str] = ..., time_ns: _Optional[int] = ..., stacks: _Optional[_Iterable[_Union[CulpritStack, _Mapping]]] = ..., lag_ns: _Optional[int] = ...) -> None: ...

class CulpritStack(_message.Message):
    __slots__ = ("ranks", "frames")
    RANKS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedScalarFieldContainer[int]
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    def __init__(self, ranks: _Optional[_Iterable[int]] = ..., frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ...) -> None: ...

class JobSummary(_message.Message):
    __slots__ = ("ranks", "ranks_with_dump", "missing_ranks", "groups", "ops", "dump_versions", "has_timing", "run")
    RANKS_FIELD_NUMBER: _ClassVar[int]
    RANKS_WITH_DUMP_FIELD_NUMBER: _ClassVar[int]
    MISSING_RANKS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    DUMP_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    HAS_TIMING_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    ranks: int
    ranks_with_dump: _containers.RepeatedScalarFieldContainer[int]
    missing_ranks: _containers.RepeatedScalarFieldContainer[int]
    groups: int
    ops: int
    dump_versions: _containers.RepeatedScalarFieldContainer[str]
    has_timing: bool
    run: str
    def __init__(self, ranks: _Optional[int] = ..., ranks_with_dump: _Optional[_Iterable[int]] = ..., missing_ranks: _Optional[_Iterable[int]] = ..., groups: _Optional[int] = ..., ops: _Optional[int] = ..., dump_versions: _Optional[_Iterable[str]] = ..., has_timing: _Optional[bool] = ..., run: _Optional[str] = ...) -> None: ...

class InputProblem(_message.Message):
    __slots__ = ("path", "reason", "fatal")
    PATH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FATAL_FIELD_NUMBER: _ClassVar[int]
    path: str
    reason: str
    fatal: bool
    def __init__(self, path: _Optional[str] = ..., reason: _Optional[str] = ..., fatal: _Optional[bool] = ...) -> None: ...
