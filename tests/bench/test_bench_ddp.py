"""The data-parallel benchmark (:mod:`fovi_lab.bench.ddp`) on the CPU: gloo processes train the digits network; the
data-parallel run follows the one-process run of the same global batch (group norm: up to the order of the sums),
two data-parallel runs end bitwise equal, and a run that fails is a note, not a crash."""

import json

import pytest
import torch.distributed as dist

from fovi_lab.bench import ddp

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")


def test_two_processes_follow_one_and_repeat_bit_for_bit(tmp_path):
    recs = ddp.ddp_records(["torch_compact"], 2, 4, 8, "group", "cpu", timeout_s=300, log=None)
    runs = {r["run"]: r for r in recs if r["kind"] == "ddp_run"}
    assert list(runs) == [name for name, _, _ in ddp.RUNS]
    assert [(runs[n]["world_size"], runs[n]["batch"]) for n in runs] == [(1, 4), (1, 8), (2, 8), (2, 8)]
    assert all(r["images_per_s"] > 0 and len(r["param_digest"]) == 64 and "note" not in r for r in runs.values())
    assert all(r["torch_device"] == "cpu" and "device" not in r for r in runs.values())   # env_info names the device
    s = recs[-1]
    assert s["kind"] == "ddp" and s["nproc"] == 2 and s["global_batch"] == 8 and s["notes"] is None
    assert s["bitwise_repeatable"] is True and runs["ddp"]["param_digest"] == runs["ddp_again"]["param_digest"]
    # group norm: the averaged gradient of two halves is the whole batch's, up to the order of the sums
    assert s["loss_max_abs_diff"] < 1e-4, s["loss_max_abs_diff"]
    assert s["scaling_efficiency"] == pytest.approx(runs["ddp"]["images_per_s"] / (2 * runs["one"]["images_per_s"]))


def test_a_failed_run_is_a_note_and_its_figures_are_none():
    runs = {"one": {"images_per_s": 100.0, "loss": [1.0], "steps": [1], "param_digest": "a"},
            "one_global": {"note": "the run failed (exit 1): boom"},
            "ddp": {"images_per_s": 150.0, "loss": [1.0], "steps": [1], "param_digest": "b"},
            "ddp_again": {"note": "the run took longer than 5 s"}}
    s = ddp.summary("warp_train", 2, 64, runs)
    assert s["scaling_efficiency"] == 0.75 and s["loss_max_abs_diff"] is None and s["bitwise_repeatable"] is None
    assert set(s["notes"]) == {"one_global", "ddp_again"}


def test_the_commands_are_train_under_torch_distributed_run():
    one = ddp.train_command("warp_train", 1, 64, 60, "batch", "cuda", "o.json")
    two = ddp.train_command("warp_train", 2, 128, 60, "batch", "cuda", "o.json")
    assert one[1:4] == ["-m", "fovi_lab", "train"] and "--batch" in one and one[one.index("--batch") + 1] == "64"
    assert two[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    assert two[6:9] == ["-m", "fovi_lab", "train"]


def test_the_command_refuses_more_processes_than_gpus_in_one_line(capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit) as exc:
        ddp.main(["--nproc", "2", "--device", "cuda"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "--nproc" in err[0]


def test_a_failing_or_hanging_run_says_why_in_one_line(tmp_path):
    import sys
    out = str(tmp_path / "never.json")
    fail = [sys.executable, "-c", "import sys; sys.stderr.write('Traceback\\nValueError: boom\\n' + '=' * 30 + "
            "'\\n'); sys.exit(1)"]
    assert ddp.run_training(fail, out, timeout_s=60) == {"note": "the run failed (exit 1): ValueError: boom"}
    hang = [sys.executable, "-c", "import time; time.sleep(60)"]
    assert ddp.run_training(hang, out, timeout_s=1) == {"note": "the run took longer than 1 s"}
