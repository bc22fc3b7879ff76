"""Stage records: where a stage ran, how long, what it did; the table the report makes of them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT
from storyrewrite.io import InputError
from storyrewrite.records import StageRecord, cpu_features, cpu_has_bf16, describe_device, read_records
from storyrewrite.report.stages import stages_table


def test_a_record_names_the_device_the_wall_time_and_the_rate(tmp_path, monkeypatch):
    monkeypatch.setenv("DVC_EXP_NAME", "gpu-dto-score")
    record = StageRecord.start(tmp_path / "stages" / "generate-nll.json")
    time.sleep(0.2)
    written = record.finish("cpu", "float32", 10, "predictions", generate_s=0.1)
    on_disk = json.loads((tmp_path / "stages" / "generate-nll.json").read_text())
    assert on_disk == written
    assert on_disk["stage"] == "generate-nll" and on_disk["device"] == "cpu" and on_disk["dtype"] == "float32"
    assert "cores)" in on_disk["device_name"]
    assert on_disk["wall_s"] >= 0.2  # at least the time the stage spent (an upper bound would time the machine)
    assert on_disk["items_per_s"] == pytest.approx(10 / on_disk["wall_s"], rel=0.05)
    assert on_disk["peak_rss_gb"] > 0 and "peak_cuda_gb" not in on_disk
    assert on_disk["experiment"] == "gpu-dto-score" and on_disk["generate_s"] == 0.1


def test_a_cpu_record_names_the_cpus_features_where_torch_ran_and_the_table_shows_them(tmp_path):
    """Two machines of one CPU name with other vector units sum in another order and run at
    other speeds: a CPU stage's record names torch's CPU capability and the CPU's bf16
    instructions (what /proc/cpuinfo lists), and the stages table shows them."""
    torch = pytest.importorskip("torch")
    written = StageRecord.start(tmp_path / "score-nll.json").finish("cpu", "float32", 3, "predictions")
    assert written["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert written["cpu_bf16"] is cpu_has_bf16()
    row = stages_table(read_records(tmp_path)).splitlines()[2]
    assert row.startswith(f"| score-nll | cpu ({written['device_name']}, "
                          f"{cpu_features(written)}) | float32 |")


def test_a_record_says_how_long_its_process_ran_before_the_stage_began(tmp_path):
    """startup_s (the interpreter, the imports, the arguments before StageRecord.start) from /proc,
    checked against the clock of the parent that started the process: at least the half second
    the child slept before starting its record, at most the child's whole life."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("startup_s comes from /proc (Linux)")
    path = tmp_path / "generate-nll.json"
    code = ("import time; time.sleep(0.5); from storyrewrite.records import StageRecord; "
            f"StageRecord.start({str(path)!r}).finish('cpu')")
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    lifetime = time.perf_counter() - began
    startup = json.loads(path.read_text())["startup_s"]
    assert 0.5 <= startup <= lifetime + 0.02  # (/proc's clock ticks: 10 ms)


def test_a_record_says_what_torch_compile_did_and_why_inductor_ran_a_graph_without_cuda_graphs(tmp_path, capsys):
    """A function compiled with one graph break is two graphs; a skip is logged through inductor's
    own call (as on a GPU, where a graph that mutates its inputs is not recorded), twice with the
    same reason: counted twice, named and printed once. The counts are the stage's own: a stage
    that compiles nothing records none, whatever compiled before it in the process."""
    import torch
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    def step(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    record = StageRecord.start(tmp_path / "train.json")
    x = torch.randn(4)
    assert torch.allclose(torch.compile(step, backend="eager")(x), x.sin().cos())
    for _ in range(2):
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (1 instances)")
    written = record.finish("cpu")
    assert (written["compiled_graphs"], written["graph_breaks"], written["cudagraph_skips"]) == (2, 1, 2)
    assert written["cudagraph_skip_reason"] == "skipping cudagraphs due to mutated inputs (1 instances)"
    assert capsys.readouterr().err.count("torch: skipping cudagraphs due to mutated inputs") == 1
    assert json.loads((tmp_path / "train.json").read_text())["cudagraph_skips"] == 2
    quiet = StageRecord.start(tmp_path / "score.json").finish("cpu")
    assert not {"compiled_graphs", "graph_breaks", "cudagraph_skips"} & quiet.keys()


def test_no_record_is_asked_for_none_is_written(tmp_path):
    assert StageRecord.start(None) is None


def test_a_torch_device_is_described_like_its_string():
    torch = pytest.importorskip("torch")
    assert describe_device(torch.device("cpu"))["device"] == "cpu"


def test_records_are_read_in_pipeline_order_and_tabulated(tmp_path):
    def write(stage, device="cpu", wall=1.0, items=None, unit=None, **extra):
        (tmp_path / f"{stage}.json").write_text(json.dumps({
            "stage": stage, "device": device, "device_name": "NVIDIA H100" if device != "cpu" else "cpu",
            "dtype": None, "wall_s": wall, "items": items, "unit": unit,
            "items_per_s": items / wall if items else None, "peak_rss_gb": 2.5, **extra}))

    write("significance", wall=3.0, items=60000, unit="resamples")
    write("score-nll", device="cuda:0", wall=12.0, items=5613, unit="predictions", peak_cuda_gb=4.0)
    write("train_nll", device="cuda:0", wall=102.4, items=316, unit="steps")
    write("generate-finetuned", device="cuda:0", wall=25.0, items=5613, unit="predictions")
    write("llm-rag", wall=2.0, items=0, unit="requests", cache_hits=8)
    records = read_records(tmp_path)
    assert [r["stage"] for r in records] == ["train_nll", "generate-finetuned", "llm-rag", "score-nll", "significance"]
    rows = stages_table(records).splitlines()
    assert rows[2] == "| train_nll | cuda:0 (NVIDIA H100) | - | 102 s | 316 steps | 3.09 steps/s | RSS 2.5 GiB |"
    # The replies an LLM stage found in its response cache, beside the requests it made.
    assert rows[4] == "| llm-rag | cpu | - | 2.0 s | 0 requests (+8 from the response cache) | - | RSS 2.5 GiB |"
    assert rows[5] == "| score-nll | cuda:0 (NVIDIA H100) | - | 12 s | 5,613 predictions | 468 predictions/s | RSS 2.5 GiB, CUDA 4.0 GiB |"
    assert rows[6] == "| significance | cpu | - | 3.0 s | 60,000 resamples | 20,000 resamples/s | RSS 2.5 GiB |"


def test_a_file_that_is_not_a_record_is_named(tmp_path):
    (tmp_path / "train.json").write_text(json.dumps({"stage": "train", "device": "cpu"}))
    with pytest.raises(InputError, match=r"train\.json: missing field `device_name` \(Record\)$"):
        read_records(tmp_path)


def test_under_ddp_only_the_first_process_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    StageRecord.start(tmp_path / "train.json").finish("cpu", "32-true", 3, "steps")
    assert not (tmp_path / "train.json").exists()
    monkeypatch.setenv("LOCAL_RANK", "0")
    StageRecord.start(tmp_path / "train.json").finish("cpu", "32-true", 3, "steps")
    assert (tmp_path / "train.json").exists()


def test_peak_memory_is_the_processs_own_not_its_parents():
    """A stage runs in a process DVC started: its peak must not include DVC's (getrusage's
    ru_maxrss carries the parent's peak across exec; VmHWM does not)."""
    import subprocess
    import sys

    from storyrewrite.records import peak_rss_gb

    ballast = bytearray(400 * 2**20)  # this process's peak: at least 0.4 GB
    ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page so it is resident
    child = subprocess.run([sys.executable, "-c", "from storyrewrite.records import peak_rss_gb; print(peak_rss_gb())"],
                           capture_output=True, text=True, check=True)
    assert peak_rss_gb() >= 0.4
    assert float(child.stdout) < 0.2


@pytest.mark.parametrize("platform, unit", [("darwin", 2**30), ("linux", 2**20), ("freebsd14", 2**20)])
def test_without_proc_the_peak_memory_is_getrusages_in_that_systems_unit(tmp_path, monkeypatch, platform, unit):
    """No /proc (macOS): getrusage's ru_maxrss, which macOS gives in bytes and Linux and the BSDs
    in KiB (getrusage(2)); a 3 GiB peak reads 3.0 on each."""
    import resource
    from types import SimpleNamespace

    from storyrewrite import records

    real = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (KiB: this is Linux)
    assert records.peak_rss_gb(tmp_path / "no-status") == pytest.approx(real / 2**20, rel=0.01)
    monkeypatch.setattr(records.sys, "platform", platform)
    monkeypatch.setattr(records.resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=3 * unit))
    assert records.peak_rss_gb(tmp_path / "no-status") == 3.0


def test_peak_memory_is_in_gib():
    """512 MiB made resident raise the peak by 0.5 (GiB: bytes / 2**30), not by 0.537 (GB) or 512."""
    import subprocess
    import sys

    code = ("from storyrewrite.records import peak_rss_gb; before = peak_rss_gb(); ballast = bytearray(512 * 2**20); "
            "ballast[::4096] = b'x' * len(ballast[::4096]); print(peak_rss_gb() - before)")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(child.stdout) == pytest.approx(0.5, abs=0.01)


def _cpuinfo(*flag_lines: str, key: str = "flags") -> str:
    return "".join(f"processor\t: {i}\nmodel name\t: a CPU\n{key}\t\t: {flags}\n\n" for i, flags in enumerate(flag_lines))


@pytest.mark.parametrize("cpuinfo, expected", [
    (_cpuinfo("fpu sse2 avx avx2 fma", "fpu sse2 avx avx2 fma"), False),  # AVX2 only: bf16 emulated
    (_cpuinfo("avx2 avx512f avx512bw avx512vl", "avx2 avx512f avx512bw avx512vl"), False),  # AVX-512 without its bf16 extension
    (_cpuinfo("avx2 avx512f avx512_bf16", "avx2 avx512f avx512_bf16"), True),
    (_cpuinfo("avx2 amx_tile amx_bf16 amx_int8"), True),
    (_cpuinfo("avx2 avx512_bf16", "avx2"), False),  # every core must have them
    (_cpuinfo("fp asimd bf16 i8mm", key="Features"), True),  # Arm
    (_cpuinfo("fp asimd", key="Features"), False),
    ("processor\t: 0\nmodel name\t: a CPU\n", None),  # no flags listed: unknown
])
def test_bf16_instructions_are_read_from_the_cpus_flags(cpuinfo, expected):
    assert cpu_has_bf16(cpuinfo) is expected


def test_the_cpu_features_are_named_with_and_without_a_bf16_answer():
    assert cpu_features({"cpu_capability": "AVX2", "cpu_bf16": False}) == "AVX2, no bf16 instructions"
    assert cpu_features({"cpu_capability": "AVX512", "cpu_bf16": True}) == "AVX512, bf16 instructions"
    assert cpu_features({"cpu_capability": "DEFAULT", "cpu_bf16": None}) == "DEFAULT"
    assert cpu_features({"cpu_capability": "AVX2"}) == "AVX2"  # a record without the bf16 answer


def test_the_cpu_is_named_from_cpuinfo_and_without_it_from_the_platform(monkeypatch):
    import os
    import platform

    from storyrewrite import records

    cores = os.cpu_count()
    monkeypatch.setattr(records, "_proc_cpuinfo", lambda: _cpuinfo("avx2", "avx2"))
    assert records.cpu_name() == f"a CPU ({cores} cores)"
    assert records.cpu_has_bf16() is False  # the same file's flags
    monkeypatch.setattr(records, "_proc_cpuinfo", lambda: None)  # not Linux
    assert records.cpu_name() == f"{platform.processor() or platform.machine()} ({cores} cores)"
    assert records.cpu_has_bf16() is None


@pytest.mark.parametrize("feature, bf16", [("1", True), ("0", False), (None, None)])  # M2 and later; M1; an Intel Mac
def test_on_macos_the_cpu_and_its_bf16_come_from_sysctl(tmp_path, monkeypatch, feature, bf16):
    """A Mac has no /proc: `sysctl -n` names the CPU and says whether it has bf16 instructions
    (here a stand-in sysctl on the PATH answers as macOS's does, exiting 1 for a name it lacks)."""
    import os
    import platform

    from storyrewrite import records

    settings = {"machdep.cpu.brand_string": "Apple M2 Pro", "hw.optional.arm.FEAT_BF16": feature}
    answers = "\n".join(f'  {name}) echo "{value}" ;;' for name, value in settings.items() if value is not None)
    (tmp_path / "sysctl").write_text(f'#!/bin/sh\n[ "$1" = -n ] || exit 2\ncase "$2" in\n{answers}\n'
                                     f'  *) echo "sysctl: unknown oid \'$2\'" >&2; exit 1 ;;\nesac\n')
    (tmp_path / "sysctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(records, "_proc_cpuinfo", lambda: None)
    monkeypatch.setattr(records.sys, "platform", "darwin")
    assert records.cpu_name() == f"Apple M2 Pro ({os.cpu_count()} cores)"
    assert records.cpu_has_bf16() is bf16
    monkeypatch.setattr(records.sys, "platform", "linux")  # (sysctl is asked on macOS alone)
    assert records.cpu_name() == f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
    assert records.cpu_has_bf16() is None
