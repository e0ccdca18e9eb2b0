"""hipress.integrations.lightning in real Lightning runs: ``Trainer(accelerator="cpu",
devices=2, strategy="ddp")`` on gloo, launched as Lightning launches it (rank 1 is the worker
script run again).

One launch of tests/integration_workers/lightning_train.py trains every variant (Lightning
without hipress, with ``algorithm=None``, with onebit, the same onebit job in a plain DDP loop,
and one epoch with onebit followed by a checkpoint); a second launch, in fresh processes,
resumes that checkpoint. The tests compare the parameters each run wrote. A third launch, of two
independent processes, has rank 1 exit mid-training under ``OnExceptionCheckpoint``.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from integration_launch import launch, run_ranks

pytest.importorskip("lightning")

from hipress.casync import CaSyncError, CaSyncState
from hipress.integrations.lightning import HipressCallback

WORKER = Path(__file__).parent / "integration_workers" / "lightning_train.py"
RANKS = (0, 1)


def _launch(out: Path, mode: str) -> None:
    launch([sys.executable, str(WORKER), str(out), mode], out, f"the {mode} run")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Both launches; every file they wrote, by name (``onebit-rank0``, ...)."""
    out = tmp_path_factory.mktemp("lightning")
    _launch(out, "full")
    _launch(out, "resume")
    return out, {p.stem: torch.load(p) for p in out.glob("*.pt")}


def _same(runs: dict[str, Any], a: str, b: str, rank: int) -> bool:
    pa, pb = runs[f"{a}-rank{rank}"]["params"], runs[f"{b}-rank{rank}"]["params"]
    assert pa.keys() == pb.keys()
    return all(torch.equal(pa[n], pb[n]) for n in pa)


@pytest.mark.parametrize("rank", RANKS)
def test_lossless_hook_equals_lightning_without_hipress(runs: Any, rank: int) -> None:
    assert _same(runs[1], "none", "plain", rank)


@pytest.mark.parametrize("rank", RANKS)
def test_onebit_equals_the_same_job_in_a_plain_ddp_loop(runs: Any, rank: int) -> None:
    assert _same(runs[1], "manual-plain", "plain", rank)  # the two loops see the same batches
    assert _same(runs[1], "onebit", "manual", rank)


@pytest.mark.parametrize("rank", RANKS)
def test_onebit_compresses(runs: Any, rank: int) -> None:
    onebit, none = runs[1][f"onebit-rank{rank}"], runs[1][f"none-rank{rank}"]
    assert none["sent"] == none["uncompressed"]
    assert onebit["sent"] * 8 < onebit["uncompressed"]
    assert not _same(runs[1], "onebit", "plain", rank)


@pytest.mark.parametrize("rank", RANKS)
def test_the_callback_logs_the_metrics(runs: Any, rank: int) -> None:
    logged = runs[1][f"onebit-rank{rank}"]["logged"]
    assert 0 < logged["hipress/bytes_ratio"] < 1 / 8
    assert logged["hipress/compressed_tensors"] >= 1 and logged["hipress/encode_ms"] > 0
    if rank == 0:  # the logger's file (Lightning's loggers write from rank 0), one row a step
        rows = list(csv.DictReader((runs[0] / "csv" / "version_0" / "metrics.csv").open()))
        ratios = [float(r["hipress/bytes_ratio"]) for r in rows if r["hipress/bytes_ratio"]]
        steps = [int(float(r["hipress/step"])) for r in rows if r["hipress/step"]]
        assert len(ratios) >= 6 and all(0 < x < 1 / 8 for x in ratios)
        assert steps == sorted(steps) and len(set(steps)) == len(steps)


@pytest.mark.parametrize("rank", RANKS)
def test_resume_from_a_checkpoint_is_bit_exact(runs: Any, rank: int) -> None:
    assert _same(runs[1], "resumed", "onebit", rank)
    assert _same(runs[1], "onebit", "onebit", 1 - rank)


def test_checkpoint_holds_every_ranks_state(runs: Any) -> None:
    ckpt = torch.load(runs[0] / "epoch1.ckpt", weights_only=False)
    saved = ckpt["callbacks"]["HipressCallback"]
    assert saved["world_size"] == 2
    assert [sd["rank"] for sd in saved["ranks"]] == [0, 1]
    assert CaSyncState.plan_of(saved).algorithm == "onebit"


def test_a_dead_peer_leaves_an_emergency_checkpoint_and_the_comm_error(tmp_path: Path) -> None:
    # rank 1 exits in its third step; rank 0 must write OnExceptionCheckpoint's file with its
    # own compression state (a gather from the dead rank would fail) and end with CaSync's
    # CommError, not the backend's error from a later collective
    rc, out = run_ranks([str(WORKER), str(tmp_path), "peer-dies"], tmp_path, "the peer-dies run",
                        timeout=150)  # fmt: skip
    assert rc == 0, out[-6000:]
    died = torch.load(tmp_path / "died-rank0.pt")
    assert died["error"] == "CommError", died
    assert "a peer may have exited" in died["message"]
    saved = torch.load(tmp_path / "emergency.ckpt", weights_only=False)
    hipress_state = saved["callbacks"]["HipressCallback"]
    assert hipress_state["world_size"] == 2 and hipress_state["missing"] == [1]
    assert hipress_state["ranks"][0]["rank"] == 0 and hipress_state["ranks"][1] is None
    assert "compression state only, ranks [1] are missing" in out


def test_a_strategy_without_ddp_is_refused(tmp_path: Path) -> None:
    import lightning.pytorch as pl

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            return self.lin(batch[0]).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(2, 2)))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         default_root_dir=tmp_path, callbacks=[HipressCallback("onebit")])  # fmt: skip
    with pytest.raises(CaSyncError, match=r"DistributedDataParallel.*hipress\.fsdp\.register in "
                       r"configure_model"):  # fmt: skip
        trainer.fit(Tiny(), data)


def test_a_checkpoint_state_that_is_no_dict_is_refused() -> None:
    with pytest.raises(CaSyncError, match="not a CaSync state dict"):
        HipressCallback("onebit").load_state_dict([1, 2])  # type: ignore[arg-type]


def test_process_group_option_is_refused() -> None:
    with pytest.raises(CaSyncError, match="process group"):
        HipressCallback("onebit", process_group=object())


@pytest.mark.parametrize("rank", RANKS)
def test_exclude_reaches_the_plan(runs: Any, rank: int) -> None:
    kept = runs[1][f"onebit-rank{rank}"]["kept"]
    assert kept == {"net.0.bias": "excluded by '*.bias'", "net.2.bias": "excluded by '*.bias'"}
