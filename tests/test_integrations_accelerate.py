"""hipress.integrations.accelerate in real Accelerate runs: 2 CPU processes on gloo, launched
with torchrun (``Accelerator(cpu=True)`` reads its environment).

One launch of tests/integration_workers/accelerate_train.py trains every variant (Accelerate
without hipress but with ``DistributedDataParallelKwargs(comm_hook=casync_hook)``, with
``algorithm=None``, with onebit, the same onebit job in a plain DDP loop, and 4 steps with onebit
followed by ``save_state``); a second launch, in fresh processes, resumes that state. The tests
compare the parameters each run wrote. Two more launches save from the main process alone
(``if accelerator.is_main_process: accelerator.save_state(...)``) and resume that state.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from integration_launch import launch

accelerate = pytest.importorskip("accelerate")

from hipress.casync import CaSyncError  # noqa: E402
from hipress.integrations import accelerate as hipress_accelerate  # noqa: E402

WORKER = Path(__file__).parent / "integration_workers" / "accelerate_train.py"
RANKS = (0, 1)


def _launch(out: Path, mode: str, timeout: float = 180) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--standalone", str(WORKER), str(out), mode]  # fmt: skip
    return launch(cmd, out, f"the {mode} run", timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both launches; every file they wrote, by name (``onebit-rank0``, ...)."""
    out = tmp_path_factory.mktemp("accelerate")
    _launch(out, "full")
    _launch(out, "resume")
    files = {p.stem: torch.load(p) for p in out.glob("*.pt")}
    rank1 = out / "state" / hipress_accelerate.FILE.format(rank=1)
    return files | {"saved-by-rank1": torch.load(rank1) if rank1.exists() else None}


def _same(runs: dict[str, Any], a: str, b: str, rank: int) -> bool:
    pa, pb = runs[f"{a}-rank{rank}"]["params"], runs[f"{b}-rank{rank}"]["params"]
    assert pa.keys() == pb.keys()
    return all(torch.equal(pa[n], pb[n]) for n in pa)


@pytest.mark.parametrize("rank", RANKS)
def test_comm_hook_in_ddp_kwargs_is_ignored(runs: dict[str, Any], rank: int) -> None:
    # what docs/how-to/frameworks.md says: Accelerate registers only its built-in hooks
    assert runs[f"plain-rank{rank}"]["hook_after_prepare"] == ""
    assert runs[f"onebit-rank{rank}"]["hook"] == "casync_hook"


@pytest.mark.parametrize("rank", RANKS)
def test_lossless_hook_equals_accelerate_without_hipress(runs: dict[str, Any], rank: int) -> None:
    assert _same(runs, "none", "plain", rank)


@pytest.mark.parametrize("rank", RANKS)
def test_onebit_equals_the_same_job_in_a_plain_ddp_loop(runs: dict[str, Any], rank: int) -> None:
    assert _same(runs, "manual-plain", "plain", rank)  # the two loops compute the same
    assert _same(runs, "onebit", "manual", rank)


@pytest.mark.parametrize("rank", RANKS)
def test_onebit_compresses(runs: dict[str, Any], rank: int) -> None:
    onebit, none = runs[f"onebit-rank{rank}"], runs[f"none-rank{rank}"]
    assert none["sent"] == none["uncompressed"]
    assert onebit["sent"] * 8 < onebit["uncompressed"]
    assert not _same(runs, "onebit", "plain", rank)


@pytest.mark.parametrize("rank", RANKS)
def test_trackers_receive_the_metrics(runs: dict[str, Any], rank: int) -> None:
    # log_metrics after every step: the main process's trackers get each step's figures
    logged = runs[f"onebit-rank{rank}"]["logged"]
    if rank != 0:
        assert logged == []  # (Accelerate logs from the main process only)
        return
    steps = [step for step, _ in logged]
    assert steps == list(range(12))
    for step, metrics in logged:
        assert metrics["hipress/step"] == step
        assert 0 < metrics["hipress/bytes_ratio"] < 1 / 8
        assert metrics["hipress/compressed_tensors"] >= 1
        assert metrics["hipress/encode_ms"] > 0
    none = runs[f"none-rank{rank}"]["logged"]
    assert all(m["hipress/bytes_ratio"] == 1.0 for _, m in none)


@pytest.mark.parametrize("rank", RANKS)
def test_resume_from_save_state_is_bit_exact(runs: dict[str, Any], rank: int) -> None:
    assert _same(runs, "resumed", "onebit", rank)
    # the control: without the compression state, the same resume ends elsewhere
    assert not _same(runs, "forgotten", "onebit", rank)


def test_a_save_by_the_main_process_alone_finishes_and_resumes(tmp_path: Path) -> None:
    # no collective in save_state: rank 1 trains on while rank 0 saves (each rank gives up
    # after 60 s, the group after 20 s: a hang fails here, bounded)
    _launch(tmp_path, "rank0-save", timeout=150)
    saved = sorted(p.name for p in (tmp_path / "rank0-state").iterdir())
    assert "custom_checkpoint_0.pkl" in saved
    # rank 1's file is from the earlier save into the same folder (step 2): it is left out
    assert (
        torch.load(tmp_path / "rank0-state" / hipress_accelerate.FILE.format(rank=1))["step"] == 2
    )
    out = _launch(tmp_path, "rank0-resume", timeout=150)
    assert "holds step 2, the checkpoint step [4]: left out" in out
    assert "the checkpoint holds no compression state of rank 1" in out
    for rank in RANKS:  # both resumed at the saved step and trained two more
        assert torch.load(tmp_path / f"rank0-resume-rank{rank}.pt")["step"] == 6


def test_every_rank_that_saves_writes_its_own_state(runs: dict[str, Any]) -> None:
    # the all-rank save of the full run: rank 1's state in a file of its own (the resume
    # from it is bit-exact: test_resume_from_save_state_is_bit_exact)
    assert runs["saved-by-rank1"] is not None and runs["saved-by-rank1"]["rank"] == 1


def test_a_model_without_ddp_is_refused() -> None:
    with pytest.raises(CaSyncError, match="DistributedDataParallel"):
        hipress_accelerate.register(accelerate.Accelerator(cpu=True), torch.nn.Linear(2, 1))


def test_ddp_kwargs_register_no_custom_hook() -> None:
    # Accelerate's own registration, on a stand-in model: a custom hook is dropped silently
    from hipress.casync import casync_hook

    calls: list[Any] = []

    class Model:
        def register_comm_hook(self, state: Any, hook: Any) -> None:
            calls.append(hook)

    accelerate.DistributedDataParallelKwargs(comm_hook=casync_hook).register_comm_hook(Model())
    assert calls == []


@pytest.mark.parametrize("rank", RANKS)
def test_exclude_reaches_the_plan(runs: Any, rank: int) -> None:
    kept = runs[f"onebit-rank{rank}"]["kept"]
    assert kept == {"0.bias": "excluded by '*.bias'", "2.bias": "excluded by '*.bias'"}
