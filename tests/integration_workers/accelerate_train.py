"""Accelerate runs for tests/test_integrations_accelerate.py, on 2 CPU processes:
``torchrun --nproc-per-node 2 accelerate_train.py OUT MODE``.

MODE ``full`` trains 12 steps without hipress (with ``DistributedDataParallelKwargs(comm_hook=
casync_hook)``, which Accelerate ignores), with ``algorithm=None``, with onebit, the onebit job
in a plain DDP loop, and 4 steps with onebit followed by ``save_state``; MODE ``resume`` loads
that state in fresh processes and trains to step 12, once as saved (with ``plan="auto"``,
which takes the saved plan) and once with the compression state reset after loading (the
control). Each run writes ``OUT/<run>-rank<r>.pt``. MODE ``rank0-save`` trains 6 steps with
onebit, saves after step 2 from every rank and after step 4 from the main process only (``if
accelerator.is_main_process: accelerator.save_state(...)``), into the same folder; MODE ``rank0-resume`` loads that state on both ranks and trains
to step 6. Every rank of these two gives up after 60 s (a hang fails the test, never CI).
"""

from __future__ import annotations

import faulthandler
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import toy
from accelerate import Accelerator, DistributedDataParallelKwargs, InitProcessGroupKwargs
from accelerate.tracking import GeneralTracker
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import hipress.casync
from hipress.casync import casync_hook
from hipress.integrations import accelerate as hipress_accelerate

STEPS, CHECKPOINT_AT = 12, 4


def batches() -> list[Any]:
    """This rank's batches for all steps, in order."""
    data = toy.dataset()
    loader = DataLoader(data, batch_size=toy.BATCH, sampler=DistributedSampler(data, shuffle=False))
    return list(loader) * 3


def hook_name(ddp: DistributedDataParallel) -> str:
    """The comm hook DDP has registered ("" for its own allreduce)."""
    return str(ddp._get_ddp_logging_data().get("comm_hook", ""))


class Recorder(GeneralTracker):
    """A tracker that keeps what ``accelerator.log`` hands it (Accelerate calls it on the main
    process only)."""

    name = "recorder"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    @property
    def tracker(self) -> Any:
        return self.logged

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        pass

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.logged.append((step, dict(values)))


def train(
    ddp: torch.nn.Module, opt: torch.optim.Optimizer, start: int, stop: int, backward: Any,
    after: Any = None,
) -> None:  # fmt: skip
    data = batches()
    for step in range(start, stop):
        x, y = data[step]
        opt.zero_grad()
        backward(torch.nn.functional.mse_loss(ddp(x), y))
        opt.step()
        if after is not None:
            after(step)


def run(
    out: Path,
    name: str,
    algorithm: str | None,
    stop: int = STEPS,
    *,
    hipress: bool = True,
    save: Path | None = None,
    load: Path | None = None,
    forget: bool = False,
    options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> None:
    recorder = Recorder()
    accelerator = Accelerator(cpu=True, log_with=[recorder], **kwargs)
    accelerator.init_trackers("hipress")
    net = toy.net()
    model, opt = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    extra: dict[str, Any] = {"hook_after_prepare": hook_name(model)}
    state = None
    if hipress:
        options = options or {"rule": toy.RULE}
        state = hipress_accelerate.register(accelerator, model, algorithm, **options)
    start = 0
    if load is not None:
        fresh = state.state_dict() if state is not None and forget else None
        accelerator.load_state(str(load))
        start = CHECKPOINT_AT
        if fresh is not None:  # the control: resume with error feedback lost
            state.load_state_dict(fresh)
    after = None
    if state is not None:
        after = lambda step: hipress_accelerate.log_metrics(accelerator, state, step=step)  # noqa: E731
    train(model, opt, start, stop, accelerator.backward, after)
    if save is not None:
        accelerator.save_state(str(save))
    if state is not None:
        last = state.stats.last
        extra |= {"sent": last.bytes_sent, "uncompressed": last.bytes_uncompressed,
                  "hook": hook_name(model), "kept": dict(state.plan.meta.get("kept_plain", {})),
                  "logged": recorder.logged}  # fmt: skip
    toy.save_params(net, out, name, **extra)


def plain_ddp(out: Path, name: str, algorithm: str | None) -> None:
    """The same job in a plain DDP loop (with hipress.casync.register): the expected result."""
    net = toy.net()
    ddp = DistributedDataParallel(net)
    if algorithm:
        hipress.casync.register(ddp, algorithm, rule=toy.RULE)
    train(ddp, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), 0, STEPS,
          lambda loss: loss.backward())  # fmt: skip
    toy.save_params(net, out, name)


def rank0_checkpoint(out: Path, mode: str) -> None:
    """Save from the main process only after step 4 (``rank0-save``), or resume that state on
    every rank (``rank0-resume``); train to step 6 either way."""
    faulthandler.dump_traceback_later(60, exit=True)
    short = InitProcessGroupKwargs(timeout=timedelta(seconds=20))
    accelerator = Accelerator(cpu=True, kwargs_handlers=[short])
    net = toy.net()
    model, opt = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    state = hipress_accelerate.register(accelerator, model, "onebit", rule=toy.RULE)
    if mode == "rank0-save":
        train(model, opt, 0, 2, accelerator.backward)
        accelerator.save_state(str(out / "rank0-state"))  # every rank: a file of rank 1's
        train(model, opt, 2, CHECKPOINT_AT, accelerator.backward)
        if accelerator.is_main_process:  # into the same folder: rank 1's file is stale now
            accelerator.save_state(str(out / "rank0-state"))
    else:
        accelerator.load_state(str(out / "rank0-state"))
    train(model, opt, CHECKPOINT_AT, CHECKPOINT_AT + 2, accelerator.backward)
    toy.save_params(net, out, mode, step=state._rt.engine.step if state._rt else -1)


def main(out: Path, mode: str) -> None:
    state_dir = out / "state"
    if mode.startswith("rank0-"):
        rank0_checkpoint(out, mode)
    elif mode == "full":
        ignored = DistributedDataParallelKwargs(comm_hook=casync_hook)
        run(out, "plain", None, hipress=False, kwargs_handlers=[ignored])
        run(out, "none", None)
        # (exclude= names the biases, which the rule keeps plain anyway: same numbers)
        run(out, "onebit", "onebit", options={"rule": toy.RULE, "exclude": "*.bias"})
        run(out, "first", "onebit", CHECKPOINT_AT, save=state_dir)
        plain_ddp(out, "manual", "onebit")
        plain_ddp(out, "manual-plain", None)
    else:
        # plan="auto" takes the checkpoint's plan (loaded before any step), measuring nothing
        run(out, "resumed", "onebit", load=state_dir, options={"plan": "auto"})
        run(out, "forgotten", "onebit", load=state_dir, forget=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
