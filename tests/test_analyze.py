"""The scenario suite: for each way a job goes wrong, the verdict and the culprit are right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fr2perfetto.convert import analyse
from fr2perfetto.layout.streams import LAUNCH_FLOW_BASE
from fr2perfetto.layout.timeline import FINDING_FLOW_BASE
from fr2perfetto.read.job import load_job
from fr2perfetto.render.report import parse_report_json

from .agreement import disagreements
from .conftest import ROOT, run_cli
from .tracecheck import read_trace

# scenario -> (status, culprit ranks, finding kinds, words the summary must contain)
GLOO = {
    "healthy": ("healthy", [], [], "every op matched"),
    "skip": ("hang", [2], ["missing"], "rank 2 never issued all_reduce #4 of default_pg"),
    "skip_subgroup": ("hang", [1], ["missing"], "rank 1 never issued all_reduce #3 of tp"),
    "deadlock": ("hang", [0, 1], ["deadlock"], "wait for each other in all_reduce #2 of x"),
    "size_mismatch": ("mismatch", [3], ["size_mismatch"], "sizes differ in all_reduce #2"),
    "dtype_mismatch": ("mismatch", [1], ["dtype_mismatch"], "dtypes differ in all_reduce #2"),
    "type_mismatch": ("mismatch", [2], ["type_mismatch"], "ops differ in all_reduce #2"),
    "order_swap": ("mismatch", [3], ["type_mismatch", "type_mismatch"], "ops differ in all_reduce #2"),
    # scatter/gather to root 2 (and to each tp pair's second rank), uneven all_to_all_single, broadcast from 3
    "data_ops": ("healthy", [], [], "every op matched"),
    "grid_3d": ("healthy", [], [], "every op matched"),  # 2 tp x 2 pp x 2 dp
    "grid_3d_skip": ("hang", [5], ["missing", "missing"], "rank 5 never issued all_reduce #2 of"),  # dp or pp first
}
NCCL = {
    "demo": ("hang", [5], ["missing"], "rank 5 never issued all_reduce #4 of tp"),
    "stuck": ("hang", [], ["stuck"], "stuck on every rank"),
    "send_without_recv": ("hang", [1], ["p2p"], "send 0->1 #2 has no matching recv on rank 1"),
    "straggler": ("slow", [6], ["straggler"], "rank 6 enqueues late in default_pg: 40.0 ms median"),
    "missing_dump": ("hang", [3], ["no_dump"], "rank 3 left no dump and ranks 0-2 wait for it"),
    "wrap": ("hang", [1], ["missing"], "rank 1 never issued all_reduce #21"),
    "mixed_formats": ("mismatch", [2], ["size_mismatch"], "sizes differ in all_reduce #4"),
    "victim": ("hang", [2], ["missing", "missing"], "rank 2 never issued all_reduce #3 of dp"),
}


def analyze_json(folder: Path) -> tuple[int, dict]:
    code, stdout, _stderr = run_cli("analyze", str(folder), "--json")
    report = parse_report_json(stdout)  # validates against the schema in proto/
    assert report.schema_version == "4"
    return code, json.loads(stdout)


def check(folder: Path, expected: tuple[str, list[int], list[str], str]) -> dict:
    status, culprits, kinds, words = expected
    code, report = analyze_json(folder)
    verdict = report["verdict"]
    assert verdict["status"] == status
    assert verdict.get("culprit_ranks", []) == culprits
    assert [f["kind"] for f in report.get("findings", [])] == kinds
    assert words in verdict["summary"]
    assert code == (0 if not kinds else 1)
    return report


@pytest.mark.parametrize("scenario", list(GLOO))
def test_real_gloo_scenarios(gloo_job, scenario: str):
    check(gloo_job(scenario), GLOO[scenario])


def test_real_data_ops_record_what_makes_them_look_unequal(gloo_job):
    # What the healthy verdict above must not be fooled by: non-roots record an empty side, and
    # the all_to_all_single sizes differ from rank to rank.
    from fr2perfetto.read.job import load_job

    job = load_job([str(gloo_job("data_ops"))])
    scatters = {r: d.entries[0] for r, d in job.dumps.items()}
    assert all(e.op == "scatter" for e in scatters.values())
    assert [r for r, e in sorted(scatters.items()) if e.input_dtypes] == [2]  # only the root sends
    sizes = {next(e.input_sizes for e in d.entries if e.op == "all_to_all") for d in job.dumps.values()}
    assert len(sizes) > 1


def test_a_gloo_rank_whose_dump_is_lost_is_seen_from_the_gap_it_leaves(gloo_job, tmp_path: Path):
    # gloo's pg_config lists no ranks: the default group, the world, runs from rank 0 to the largest seen
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for path in gloo_job("healthy").iterdir():
        if not path.name.startswith("gloo_trace_rank_1"):
            (dumps / path.name).write_bytes(path.read_bytes())
    code, report = analyze_json(dumps)
    # without its dump nothing says it was well: never healthy. Whether a rank is seen waiting for it
    # depends on whether a rank's last op had completed when it dumped (its pg_status): then rank 1 is
    # the culprit, else nobody is and the verdict is undecided.
    verdict = report["verdict"]
    assert (verdict["status"], code) in (("undecided", 3), ("hang", 1))
    assert verdict.get("culprit_ranks", []) == ([1] if verdict["status"] == "hang" else [])
    assert "rank 1 left no dump" in verdict["summary"]
    assert [f["kind"] for f in report["findings"]] == ["no_dump"]
    out = tmp_path / "t.pftrace"
    assert run_cli("convert", str(dumps), "-o", str(out), "-q")[0] == 0
    trace = read_trace(str(out))
    assert trace.titles["rank 1"] == ("rank 1 · CULPRIT" if verdict["status"] == "hang" else "rank 1 · no dump")
    [track] = [u for u, (n, parent) in trace.tracks.items() if n == "no dump" and parent is not None]
    assert trace.process_of(track) == "rank 1" and len(trace.slices[track]) == 1


def test_a_lone_dump_with_a_huge_rank_makes_no_world_of_that_size(gloo_job, tmp_path: Path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    source = gloo_job("healthy") / "gloo_trace_rank_0"
    (dumps / "gloo_trace_rank_0").write_bytes(source.read_bytes())
    (dumps / "gloo_trace_rank_9999999").write_bytes(source.read_bytes())
    code, stdout, _ = run_cli("info", str(dumps))
    assert code == 0 and "2 dumps, 2 ranks" in stdout


@pytest.mark.parametrize("scenario", list(NCCL))
def test_nccl_layout_scenarios(nccl_job, scenario: str):
    check(nccl_job(scenario), NCCL[scenario])


def test_victim_is_not_blamed(nccl_job):
    report = check(nccl_job("victim"), NCCL["victim"])
    tp = report["findings"][1]
    assert tp["group"]["desc"] == "tp" and tp.get("culprit_ranks", []) == []
    assert any("rank 1 is a victim" in line and "dp" in line for line in tp["evidence"])


def test_two_member_mismatch_is_undecided(nccl_job, tmp_path: Path):
    from .conftest import nccl_layout

    job = nccl_layout.Job(2)
    job.collective("all_reduce")
    job.collective("all_reduce", sizes={1: 4}, hang=True)
    job.dump(str(tmp_path))
    code, report = analyze_json(tmp_path)
    (finding,) = report["findings"]
    assert finding["kind"] == "size_mismatch" and finding.get("culprit_ranks", []) == []
    assert report["verdict"]["status"] == "undecided" and code == 3  # undecided has an exit code of its own
    assert any("cannot be decided" in line for line in finding["evidence"])


def test_finding_fields_for_a_bug_report(gloo_job):
    _, report = analyze_json(gloo_job("skip"))
    (finding,) = report["findings"]
    assert finding["group"] == {"name": "0", "desc": "default_pg", "members": [0, 1, 2, 3]}
    assert (finding["seq"], finding["op"], finding["culprit_ranks"]) == (4, "all_reduce", [2])
    assert finding["culprit_frames"][0]["name"] == "all_reduce"
    assert report["verdict"]["category"].startswith("a rank never reached the collective")
    assert report["job"]["ranks"] == 4


def test_terminal_output_verdict_first_and_exit_codes(gloo_job, nccl_job, tmp_path: Path):
    code, stdout, _ = run_cli("analyze", str(gloo_job("skip")))
    assert code == 1
    assert stdout.index("HANG") < stdout.index("culprit rank 2") < stdout.index("1. missing")
    # not a terminal: nothing wrapped, so that grep finds a finding whole on its line
    assert any(line.startswith("rank 2 never issued") and line.endswith("wait in it") for line in stdout.splitlines())
    code, stdout, _ = run_cli("analyze", str(gloo_job("healthy")))
    assert code == 0 and "HEALTHY" in stdout
    (tmp_path / "rank_0").write_text("nonsense")
    code, stdout, stderr = run_cli("analyze", str(tmp_path / "rank_0"), "--json")
    assert code == 2 and stdout == "" and "rank_0" in stderr


def test_trace_carries_the_findings(nccl_job, tmp_path: Path):
    out = tmp_path / "t.pftrace"
    code, _, stderr = run_cli("convert", str(nccl_job("demo")), "-o", str(out))
    assert code == 0, stderr
    trace = read_trace(str(out))
    (findings_track,) = trace.tracks_named("Findings")
    assert trace.tracks[findings_track][1] is None  # a global track, above every process
    finding_slices = [s for s in trace.all_slices() if trace.process_of(s[0]) == "Findings"]
    assert len(finding_slices) == 1
    _, _start, _end, name, args = finding_slices[0]
    assert name.startswith("missing: rank 5 never issued") and args["culprit_ranks"] == "5"
    # a flow from the finding to the op on every rank that issued it, and to the culprit's marker
    (flow,) = [f for f in trace.flows if FINDING_FLOW_BASE <= f < LAUNCH_FLOW_BASE]
    assert trace.flows[flow] == 1 + 3 + 1
    assert "CULPRIT: missing" in trace.process_labels["rank 5"]
    assert not any("CULPRIT" in label for r in ("rank 4", "rank 6") for label in trace.process_labels[r])


def test_committed_report_module_is_up_to_date(tmp_path: Path):
    """``make proto`` output must match what is committed."""
    from grpc_tools import protoc

    root = Path(__file__).resolve().parent.parent
    args = ["protoc", f"-I{root / 'proto'}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
            str(root / "proto" / "fr2perfetto_report.proto")]  # fmt: skip
    assert protoc.main(args) == 0
    for name in ("fr2perfetto_report_pb2.py", "fr2perfetto_report_pb2.pyi"):
        committed = (root / "src" / "fr2perfetto" / "proto" / name).read_text()
        assert (tmp_path / name).read_text() == committed, f"{name} is stale: run make proto"


ALL_SAMPLES = sorted(p for p in (ROOT / "samples").glob("*/*") if p.is_dir())


@pytest.mark.parametrize("sample", ALL_SAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_words_around_every_samples_verdict_agree(sample: Path):
    diagnosis = analyse(load_job([str(sample)])).diagnosis
    assert disagreements(diagnosis) == []


def test_a_straggler_alone_is_slow_never_healthy():
    code, stdout, _ = run_cli("analyze", str(ROOT / "samples" / "nccl" / "straggler"))
    assert code == 1 and "HEALTHY" not in stdout and " SLOW " in stdout and "culprit rank 6" in stdout
    assert "Root cause: slow rank" in stdout


SAMPLE_FOLDERS = sorted(p for p in (ROOT / "samples").glob("*/*") if p.is_dir())


@pytest.mark.parametrize("sample", SAMPLE_FOLDERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_redaction_never_changes_a_samples_verdict_and_only_healthy_exits_0(sample: Path):
    said = []
    for redact in ([], ["--redact"]):
        code, stdout, _ = run_cli("analyze", str(sample), "--json", *redact)
        report = json.loads(stdout)
        verdict = report["verdict"]
        assert (code == 0) == (verdict["status"] == "healthy"), (code, verdict["summary"])
        assert code == {"healthy": 0, "undecided": 3}.get(verdict["status"], 1)
        said.append(
            (code, verdict["status"], verdict.get("culprit_ranks"), [f["kind"] for f in report.get("findings", [])])
        )
    assert said[0] == said[1]
