"""Sharing the machine between concurrent stages: the worker count, the CPU threads each takes,
and one GPU per worker, with fake DVC workers and fake GPU counts."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from storyrewrite import parallel
from storyrewrite.io import InputError
from storyrewrite.models.device import resolve_device
from storyrewrite.training.run import placement

from helpers import tiny_train_config


def _fake_proc(root: Path, commands: list[list[str]]) -> Path:
    for pid, command in enumerate(commands, start=100):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cmdline").write_bytes(b"\0".join(part.encode() for part in command) + b"\0")
    return root


def test_workers_come_from_the_setting_or_from_dvc_queue_workers_running(tmp_path):
    proc = _fake_proc(tmp_path, [["python", "dvc", "exp", "queue-worker", "dvc-exp-abc-1@localhost", "--clean"],
                                 ["python", "dvc", "exp", "queue-worker", "dvc-exp-abc-2@localhost"],
                                 ["python", "stages/train.py"], ["bash"]])
    assert parallel.workers({}, proc) == 2
    assert parallel.workers({"STORYREWRITE_WORKERS": "3"}, proc) == 3
    assert parallel.workers({}, _fake_proc(tmp_path / "none", [["bash"]])) == 1
    with pytest.raises(InputError, match=r"STORYREWRITE_WORKERS = 'two' must be a whole number >= 1"):
        parallel.workers({"STORYREWRITE_WORKERS": "two"}, proc)


def test_without_proc_the_queue_workers_are_found_through_psutil_as_proc_finds_them(tmp_path, capsys):
    """macOS has no /proc: psutil reads the processes there. Here both readers, over real processes:
    two queue workers in two folders, and a DVC command that is not one."""
    folders = [tmp_path / "repo", tmp_path / "other"]
    hold = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    children = []
    try:
        for folder, command in ((folders[0], ["dvc", "exp", "queue-worker", "dvc-exp-1@localhost"]),
                                (folders[1], ["dvc", "exp", "queue-worker", "dvc-exp-2@localhost"]),
                                (folders[0], ["dvc", "exp", "run", "--queue"])):
            folder.mkdir(exist_ok=True)
            children.append(subprocess.Popen([*hold, *command], cwd=folder, stdin=subprocess.PIPE))
        ours = {child.pid for child in children}
        for proc in (Path("/proc"), tmp_path / "no-proc"):
            assert ours & set(parallel.queue_worker_pids(proc)) == {children[0].pid, children[1].pid}, proc
            assert ours & set(parallel.queue_worker_pids(proc, folders[0])) == {children[0].pid}, proc
        parallel.main(["queue-workers", "--cwd", str(folders[1])])
        assert capsys.readouterr().out == f"{children[1].pid}\n"
    finally:
        for child in children:
            child.kill()
            child.wait()
            child.stdin.close()


def test_each_worker_takes_its_share_of_the_cores(monkeypatch):
    assert [parallel.thread_share(2, n) for n in (1, 2, 3)] == [2, 1, 1]
    assert parallel.thread_share(16, 4) == 4
    assert parallel.thread_share(5, 2) == 2  # rounded down: never more threads than cores
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("STORYREWRITE_WORKERS", "1")
        assert parallel.share_machine() is None and torch.get_num_threads() == before  # torch's own choice
        monkeypatch.setenv("STORYREWRITE_WORKERS", "2")
        assert parallel.share_machine() == max(1, before // 2) == torch.get_num_threads()
        torch.set_num_threads(before)
        monkeypatch.setenv("STORYREWRITE_WORKERS", "1")  # a count given outright wins over the environment's
        assert parallel.share_machine(2) == max(1, before // 2) == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


CLAIM = """
import sys
from pathlib import Path
from storyrewrite.parallel import claim_gpu
print(claim_gpu(int(sys.argv[1]), Path(sys.argv[2])), flush=True)
sys.stdin.read()  # hold the GPU until told to end
"""


def test_each_worker_takes_a_gpu_of_its_own_and_gives_it_back_when_it_ends(tmp_path, monkeypatch):
    children, held = [], []  # `held`: each stand-in for this process's record of the locks it holds
    try:
        for expected in ("0", "1"):
            child = subprocess.Popen([sys.executable, "-c", CLAIM, "3", str(tmp_path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
            children.append(child)
            assert child.stdout.readline().strip() == expected
        held.append({})
        monkeypatch.setattr(parallel, "_held", held[-1])
        assert parallel.assigned_gpu(3, concurrent=3, directory=tmp_path) == 2
        assert parallel.assigned_gpu(3, concurrent=3, directory=tmp_path) == 2  # the one it holds, again
        # One worker or one GPU: no assignment, `auto` means what it always meant.
        assert parallel.assigned_gpu(3, concurrent=1, directory=tmp_path) is None
        assert parallel.assigned_gpu(1, concurrent=3, directory=tmp_path) is None
        held.append({})
        monkeypatch.setattr(parallel, "_held", held[-1])  # a third process: GPU 2 stays held by the one above
        with pytest.raises(InputError, match=r"all 3 GPUs are held by other stages"):
            parallel.assigned_gpu(3, concurrent=4, directory=tmp_path)
        children[0].kill()  # killed, not closed: the system releases its lock
        children[0].wait()
        assert parallel.claim_gpu(3, tmp_path) == 0
    finally:
        for child in children:
            child.kill()
            child.wait()
            child.stdin.close()
            child.stdout.close()
        for fd in (fd for record in held for fd in record.values()):
            os.close(fd)


def test_device_auto_and_training_auto_use_the_gpu_this_worker_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(parallel, "repo_temp_dir", lambda start=None: tmp_path)
    monkeypatch.setattr(parallel, "_held", {})
    config = tiny_train_config(accelerator="auto", devices="auto")
    monkeypatch.setenv("STORYREWRITE_WORKERS", "1")
    assert resolve_device("auto") == torch.device("cuda") and placement(config) == ("cuda", "auto")
    monkeypatch.setenv("STORYREWRITE_WORKERS", "2")
    try:
        assert resolve_device("auto") == torch.device("cuda:0") and placement(config) == ("cuda", [0])
        # An explicit choice is left alone.
        assert placement(tiny_train_config(accelerator="cpu", devices=1)) == ("cpu", 1)
    finally:
        for fd in parallel._held.values():
            os.close(fd)


@pytest.mark.filterwarnings("ignore:GPU available but not used")  # (the MPS this test makes up)
def test_training_auto_is_the_cpu_where_lightnings_auto_would_take_apples_gpu(monkeypatch):
    # A Mac: Apple's MPS, no CUDA. Lightning's own `auto` takes MPS; the params' `device: auto`
    # (generation, scoring) is the CPU, and so is a training section's `accelerator: auto`.
    import lightning as L
    from lightning.fabric.accelerators.mps import MPSAccelerator
    from lightning.fabric.utilities.device_parser import _select_auto_accelerator

    from storyrewrite.training.run import trainer_kwargs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(MPSAccelerator, "is_available", staticmethod(lambda: True))
    assert _select_auto_accelerator() == "mps"  # (the Mac, as Lightning sees it)
    config = tiny_train_config(accelerator="auto", devices="auto")
    assert resolve_device("auto") == torch.device("cpu") and placement(config) == ("cpu", "auto")
    assert L.Trainer(**trainer_kwargs(config), enable_checkpointing=False).strategy.root_device == torch.device("cpu")
    # Asked for by name, MPS is Lightning's to place (and to refuse where it cannot run).
    assert placement(tiny_train_config(accelerator="mps", devices="auto")) == ("mps", "auto")


def test_the_lock_files_live_in_the_outermost_repository(tmp_path):
    (tmp_path / ".dvc").mkdir()
    experiment = tmp_path / ".dvc" / "tmp" / "exps" / "tmp123"
    (experiment / ".dvc").mkdir(parents=True)
    assert parallel.repo_temp_dir(experiment / "stages") == tmp_path / ".dvc" / "tmp" / "storyrewrite"


def test_the_worker_count_is_the_least_of_the_cores_the_gpu_memory_and_the_experiments():
    # One H200 (139 GB free), 16 cores, a worker's peak 5.35 GB: the cores bound it, 16 // 2.
    chosen, lines = parallel.choose_workers(16, 2, [139.0], 5.35, 20)
    assert chosen == 8 and lines == ["16 cores at 2 threads a worker: 8", "GPU 0: 139.0 GB free x 0.9 / 5.35 GB a worker: 23",
                                     "20 experiment(s) to run: 20"]
    assert parallel.choose_workers(16, 1, [20.0], 5.35, 20)[0] == 3  # 18 GB / 5.35 GB
    assert parallel.choose_workers(16, 2, [139.0], 5.35, 3)[0] == 3  # no more workers than experiments
    assert parallel.choose_workers(64, 2, [80.0] * 4, 5.0, 20)[0] == 4  # several GPUs: one a worker
    assert parallel.choose_workers(2, 2, [], 8.0, 20)[0] == 1  # the 2-core CPU
    assert parallel.choose_workers(5, 2, [], 8.0, 20)[0] == 2  # no worker on half its threads
    assert parallel.choose_workers(16, 2, [1.0], 5.35, 20)[0] == 1  # at least one, whatever fits


def test_the_worker_count_keeps_to_the_hosts_available_memory(tmp_path):
    # A 24 GB host with 20 GB available, workers of 8.8 GB each (RLOO's training on a CPU): one fits
    # in 16 GB, whatever the cores allow.
    chosen, lines = parallel.choose_workers(16, 2, [], 8.0, 20, host_gb=20.0, worker_rss_gb=8.8)
    assert chosen == 1 and lines[1] == "host: 20.0 GB available x 0.8 / 8.80 GB a worker: 1"
    assert parallel.choose_workers(16, 2, [139.0], 5.35, 20, host_gb=130.0, worker_rss_gb=4.33)[0] == 8  # the cores bind
    assert parallel.choose_workers(16, 2, [139.0], 5.35, 20, host_gb=40.0, worker_rss_gb=4.33)[0] == 7  # 32 GB / 4.33 GB
    assert parallel.choose_workers(16, 2, [], 8.0, 20, host_gb=2.0, worker_rss_gb=8.8)[0] == 1  # at least one
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n")
    assert parallel.host_available_gb(meminfo) == 20000000 * 1024 / 1e9
    meminfo.write_text("MemTotal:       25000000 kB\n")  # an old kernel's: no bound
    assert parallel.host_available_gb(meminfo) is None
    # Without /proc/meminfo (macOS): psutil's estimate, which on Linux is MemAvailable itself.
    assert parallel.host_available_gb(tmp_path / "none") == pytest.approx(parallel.host_available_gb(), abs=0.5)


def test_the_worker_count_reads_the_gpus_free_memory_and_the_stage_records_peak(tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 143000\n")  # MiB free, as --format=csv,noheader,nounits prints it
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(parallel, "cores", lambda: 64)
    monkeypatch.setattr(parallel, "host_available_gb", lambda: 1000.0)
    records = []
    # A record's GPU peak: what torch's pool held where it says (newer records), else what it handed out.
    for name, peak, held in (("train", 5.35, 6.46), ("score", 2.1, None), ("report", None, None)):
        records.append(tmp_path / f"{name}.json")
        records[-1].write_text(f'{{"stage": "{name}", "peak_cuda_gb": {"null" if peak is None else peak}, "peak_rss_gb": 4.0'
                               + ("}" if held is None else f', "peak_cuda_reserved_gb": {held}}}'))
    (tmp_path / "torn.json").write_text('{"st')
    assert parallel.peak_gb([*records, tmp_path / "torn.json"]) == (6.46, 2)
    assert parallel.peak_gb(records, "peak_cuda_gb") == (5.35, 2)
    parallel.main(["workers", "--experiments", "40", "--records", *map(str, records), str(tmp_path / "torn.json")])
    out, err = capsys.readouterr()
    free = 143000 * 2**20 / 1e9  # 149.9 GB
    # The records count GiB (torch's bytes / 2**30): 6.46 GiB held is 6.936 GB, beside free memory in GB.
    held_gb, rss_gb = 6.46 * 1024**3 / 1000**3, 4.0 * 1024**3 / 1000**3
    assert out == f"{int(free * 0.9 // (held_gb + 0.54))}\n" == "18\n"  # + a CUDA context
    assert "GPU 0: 149.9 GB free x 0.9 / 7.48 GB a worker: 18" in err
    assert "(a worker's GPU memory, 7.48 GB: the largest peak of 2 GPU stage record(s), 6.46 GiB, + 0.54 GB of CUDA context)" in err
    assert f"host: 1000.0 GB available x 0.8 / 4.29 GB a worker: {int(800 // rss_gb)}" in err and int(800 // rss_gb) == 186
    monkeypatch.setattr(parallel, "host_available_gb", lambda: 100.0)  # 80 GB for workers of 4.29 GB (the records'), 9.5 GB (none)
    parallel.main(["workers", "--experiments", "40", "--records", *map(str, records)])
    assert capsys.readouterr()[0] == f"{int(80 // rss_gb)}\n" == "18\n"
    parallel.main(["workers", "--experiments", "40"])
    out, err = capsys.readouterr()
    assert out == "8\n" and "(a worker's host memory, 9.50 GB: no stage record: assumed)" in err
    parallel.main(["workers", "--experiments", "40", "--rss-gb", "40"])
    assert capsys.readouterr()[0] == "2\n"
    parallel.main(["workers", "--experiments", "40", "--peak-gb", "30"])
    assert capsys.readouterr()[0] == "4\n"
    with pytest.raises(InputError, match=r"--peak-gb must be a number of GB > 0, got 0.0"):
        parallel.main(["workers", "--experiments", "4", "--peak-gb", "0"])
    with pytest.raises(InputError, match=r"--rss-gb must be a number of GB > 0, got -1.0"):
        parallel.main(["workers", "--experiments", "4", "--rss-gb", "-1"])
    # None to run (a resumed comparison's plan left every run out): one worker, for what other sweeps left queued.
    parallel.main(["workers", "--experiments", "0"])
    out, err = capsys.readouterr()
    assert out == "1\n" and "0 experiment(s) to run: 1" in err
    with pytest.raises(InputError, match=r"--experiments must be a whole number >= 0, got -1"):
        parallel.main(["workers", "--experiments", "-1"])


def test_a_stage_says_its_share_of_the_machine_and_a_command_does_not(monkeypatch, capsys):
    """Beside other queue workers a stage prints the CPU threads it takes (its log says why it is
    slower); a command of the project (profiles, gather, collect) runs without that line."""
    from storyrewrite.io import run_cli, run_stage

    before = torch.get_num_threads()
    monkeypatch.setenv("STORYREWRITE_WORKERS", "2")
    try:
        ran = []
        run_cli(lambda: ran.append("command"))
        assert "CPU thread(s)" not in capsys.readouterr().err and torch.get_num_threads() == before
        run_stage(lambda: ran.append("stage"))
        assert f"{max(1, before // 2)} CPU thread(s): this machine's share" in capsys.readouterr().err
        assert ran == ["command", "stage"]
    finally:
        torch.set_num_threads(before)
    with pytest.raises(SystemExit) as ended:
        run_cli(lambda: (_ for _ in ()).throw(InputError("bad.yaml:3: no such key")))
    assert ended.value.code == 2 and capsys.readouterr().err == "error: bad.yaml:3: no such key\n"


def test_stages_beside_other_workers_take_expandable_segments_unless_set(monkeypatch):
    """torch's allocator settings are read when CUDA starts in the process, after share_machine."""
    for name in parallel.ALLOC_CONF_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")  # (share_machine sets it: restored after the test)
    before = torch.get_num_threads()
    try:
        parallel.share_machine(1)
        assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
        parallel.share_machine(2)
        assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
        monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:128")  # a user's own, under the newer name
        parallel.share_machine(2)
        assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ and os.environ["PYTORCH_ALLOC_CONF"] == "max_split_size_mb:128"
    finally:
        torch.set_num_threads(before)
        monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)


def test_workers_on_one_gpu_cap_their_memory_at_an_equal_share(monkeypatch, capsys):
    """On one GPU of 80 GB, four workers each cap torch's pool at 0.9 / 4 of it (18 GB), once a
    process; nothing is capped on a CPU, with one worker, or with a GPU a worker."""
    calls = []
    monkeypatch.setattr(parallel, "_capped", {})
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: type("Props", (), {"total_memory": 80e9})())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda fraction, index: calls.append((fraction, index)))
    assert parallel.share_gpu_memory(torch.device("cpu"), 4) is None
    assert parallel.share_gpu_memory(torch.device("cuda"), 1) is None and calls == []
    assert parallel.share_gpu_memory(torch.device("cuda"), 4) == pytest.approx(18.0)
    assert parallel.share_gpu_memory(torch.device("cuda", 0), 4) == pytest.approx(18.0)
    assert calls == [(pytest.approx(0.225), 0)]
    assert capsys.readouterr().err == ("GPU memory: at most 18.0 of 80.0 GB (0.9 / 4), this process's share of one of 4 "
                                       "concurrent workers\n")
    monkeypatch.setattr(parallel, "_capped", {})
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parallel.share_gpu_memory(torch.device("cuda", 1), 2) is None and len(calls) == 1


def test_with_each_workers_need_known_a_stage_may_take_what_the_others_leave(monkeypatch, capsys):
    """On one GPU of 80 GB, four workers that each need 9 GB (STORYREWRITE_WORKER_GPU_GB): a stage
    caps its pool at 0.9 of the GPU less 3 x 9 GB, 45 GB, so that one larger than the records'
    fits beside three of theirs; never below the equal share (18 GB) where the others need more.
    A value that is no positive number of GB is refused, naming the variable."""
    calls = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: type("Props", (), {"total_memory": 80e9})())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda fraction, index: calls.append(fraction))
    for need, cap in (("9", 0.9 * 80 - 3 * 9), ("30", 0.9 * 80 / 4)):
        monkeypatch.setattr(parallel, "_capped", {})
        assert parallel.share_gpu_memory(torch.device("cuda"), 4, {parallel.RESERVE_ENV: need}) == pytest.approx(cap)
        assert calls[-1] * 80 == pytest.approx(cap)
    assert capsys.readouterr().err.splitlines() == [
        "GPU memory: at most 45.0 of 80.0 GB (0.9 of it less 9.00 GB for each of 3 other concurrent workers)",
        "GPU memory: at most 18.0 of 80.0 GB (0.9 / 4), this process's share of one of 4 concurrent workers"]
    for bad in ("0", "-2", "many", "nan"):
        monkeypatch.setattr(parallel, "_capped", {})
        with pytest.raises(InputError, match=f"environment: STORYREWRITE_WORKER_GPU_GB = '{bad}' must be a number of GB > 0"):
            parallel.share_gpu_memory(torch.device("cuda"), 4, {parallel.RESERVE_ENV: bad})


def test_the_gpu_reserve_is_the_records_largest_peak_with_a_cuda_context(tmp_path, capsys):
    """`gpu-reserve` prints what `workers` counts for a worker's GPU memory: the records' largest
    peak (held, else handed out) plus a CUDA context; the default without a GPU record."""
    (tmp_path / "a.json").write_text(json.dumps({"stage": "train", "peak_cuda_gb": 8.19, "peak_cuda_reserved_gb": 8.71}))
    (tmp_path / "b.json").write_text(json.dumps({"stage": "train_nll", "peak_cuda_gb": 5.25}))
    (tmp_path / "c.json").write_text(json.dumps({"stage": "significance", "peak_rss_gb": 0.3}))
    parallel.main(["gpu-reserve", "--records", *(str(tmp_path / f"{n}.json") for n in "abc")])
    assert capsys.readouterr().out == f"{8.71 * 2**30 / 1e9 + parallel.GPU_CONTEXT_GB:.2f}\n" == "9.89\n"  # (GiB recorded, GB printed)
    parallel.main(["gpu-reserve", "--records", str(tmp_path / "c.json")])
    assert capsys.readouterr().out == f"{parallel.DEFAULT_PEAK_GB:.2f}\n"
