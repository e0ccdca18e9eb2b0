"""The rule of every option of the benchmarks, the demo, ``plan`` and ``profile``
(:mod:`hipress.cli.checks` runs them before the command starts). A test checks that each
option that takes a value has one here."""

from __future__ import annotations

import argparse
import re
from functools import partial
from pathlib import Path
from typing import Any

from hipress.cli.charts import check_png
from hipress.cli.checks import (
    Call,
    Int,
    Names,
    Num,
    Rule,
    UsageError,
    check_out,
    cpus,
    max_workers,
    name_patterns,
    workers_allowed,
)

__all__ = ["RULES"]

MAX_KERNEL_ELEMENTS = 1 << 30  # 4 GiB of float32 per buffer; a kernel row holds several
MAX_SYNC_BYTES = 4 << 30


def _algorithms() -> list[str]:
    from hipress.compll import algorithms

    return algorithms()


def _kernel_algorithms(flag: str, value: Any, args: argparse.Namespace) -> None:
    """``bench kernels --algorithms``: shipped names, or paths of ``.cll`` files."""
    words = [w.strip() for w in str(value).split(",") if w.strip()]
    for w in words:
        if w.endswith(".cll") and not Path(w).is_file():
            raise UsageError(flag, w, "is not a .cll file", "shipped names or .cll paths")
    names = ",".join(w for w in words if not w.endswith(".cll"))
    Names(_algorithms, "algorithm", empty=True).check(flag, names, args)


def _e2e_algorithms() -> list[str]:  # bench e2e also runs multi-round ones (powersgd)
    from hipress.compll.rounds import rounds_algorithms

    return [*_algorithms(), *rounds_algorithms()]


def _workloads() -> list[str]:
    from hipress.bench.workloads import WORKLOADS

    return list(WORKLOADS)


def _backends() -> tuple[str, ...]:
    from hipress.compll.backends.select import BACKENDS

    return BACKENDS


def _out(kind: str) -> Rule:
    return Call(lambda flag, value, args: check_out(flag, value, kind))


def _plan(flag: str, value: Any, args: argparse.Namespace, several: bool = False) -> None:
    """``auto``, ``default`` or a plan file that loads (``several``: comma-separated, once each)."""
    from hipress.core.plan import Plan, PlanError

    items = value.split(",") if several else [value]
    allowed = "auto, default or a plan file (hipress plan --out)" + ", several" * several
    if len(set(items)) < len(items):
        raise UsageError(flag, value, "names a plan twice", allowed)
    for v in (v for v in items if v not in ("auto", "default")):
        if "\0" in v:
            raise UsageError(flag, value, "holds a NUL character", allowed)
        try:
            Plan.load(v)
        except FileNotFoundError:
            raise UsageError(flag, value, f"{v!r} is no such file", allowed) from None
        except (OSError, PlanError) as exc:
            raise UsageError(flag, value, f"{v!r} is not a plan: {exc}", allowed) from None


def _profile(flag: str, value: Any, args: argparse.Namespace) -> None:
    from hipress.secopa.model.profile import Profile, ProfileError

    for v in value if isinstance(value, list) else [value]:
        if v is None:
            continue
        allowed = "a profile file (hipress profile --out)"
        if "\0" in v:
            raise UsageError(flag, v, "holds a NUL character", allowed)
        try:
            Profile.load(v)
        except FileNotFoundError:
            raise UsageError(flag, v, "is no such file", allowed) from None
        except (OSError, ValueError, ProfileError) as exc:
            raise UsageError(flag, v, f"is not a profile: {exc}", allowed) from None


def _name(flag: str, value: Any, args: argparse.Namespace) -> None:
    if not value or "/" in value or value in (".", "..") or "\0" in value:
        raise UsageError(flag, value, "is not a file name", "a basename such as e2e")


def _model_spec(flag: str, value: Any, args: argparse.Namespace) -> None:
    """A built-in model, or ``file.py:NAME`` / ``module:NAME`` with optional literal arguments
    (``NAME(vocab=8192)``) whose file exists; importing it is left to the command."""
    from hipress.secopa.model.specs import ModelSpecError, builtin_models, check_ref

    if value is None:
        return
    allowed = (
        f"{', '.join(builtin_models())}, path/to/file.py:NAME or package.module:NAME, "
        "optionally with literal arguments: 'train.py:make_model(vocab=8192)'"
    )
    try:
        check_ref(value)
    except ModelSpecError as exc:
        why = str(exc).removeprefix(f"{value!r}: ").split(" (NAME must")[0]
        problem = (
            "is not a built-in model" if why.startswith("unknown model")
            else f"names {why}" if why.startswith("no such file")
            else f"is not a model reference: {why}"
        )  # fmt: skip
        raise UsageError(flag, value, problem, allowed) from None


def _kernel_sizes(flag: str, value: Any, args: argparse.Namespace) -> None:
    allowed = "element counts from 1 to 1G (K/M/G suffixes), comma-separated, e.g. 1K,64M"
    words = [w.strip().upper() for w in str(value).split(",") if w.strip()]
    if not words:
        raise UsageError(flag, value, "names no size", allowed)
    for w in words:
        m = re.fullmatch(r"(\d{1,12})([KMG]?)", w)
        n = (
            int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]
            if m
            else 0
        )
        if not 1 <= n <= MAX_KERNEL_ELEMENTS:
            raise UsageError(flag, w, "is not an element count in range", allowed)


def _device(flag: str, value: Any, args: argparse.Namespace) -> None:
    if value == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError(flag, value, "needs a CUDA GPU and torch sees none",
                             "auto, cpu or emulated on this machine")  # fmt: skip


def _algorithm_params(flag: str, value: Any, args: argparse.Namespace) -> None:
    """``--algorithm`` with its ``--param`` items: the algorithm loads with them."""
    from hipress.cli.args import check_params
    from hipress.compll import load

    raw = getattr(args, "param", [])
    if value is None and (not raw or getattr(args, "profile", None)):
        return  # the default algorithm, or a profile's (whose parameters the command checks)
    if value is None:
        from hipress.codec.planning import DEFAULT_ALGORITHM

        value = DEFAULT_ALGORITHM
    Names(_algorithms, "algorithm").check(flag, value, args)
    check_params(value, raw, load)


def _plan_algorithm(flag: str, value: Any, args: argparse.Namespace) -> None:
    """``plan --algorithm``: a multi-round one too (:mod:`hipress.cli.secopa_rounds`)."""
    from hipress.cli.secopa_rounds import check_rounds_algorithm

    if not check_rounds_algorithm(flag, value, args):
        _algorithm_params(flag, value, args)


def _variants(flag: str, value: Any, args: argparse.Namespace) -> None:
    """``ALGORITHM[:FEEDBACK]`` entries of ``bench fsdp --variants``."""
    from hipress.compll import load
    from hipress.fsdp import FsdpError
    from hipress.fsdp.feedback import resolve_feedback

    Names(_algorithms, "algorithm", colon=True).check(flag, value, args)
    for v in (w.strip() for w in value.split(",") if w.strip()):
        alg, _, fb = v.partition(":")
        try:
            resolve_feedback(load(alg, backend="reference"), fb or "auto")
        except FsdpError as exc:
            raise UsageError(flag, v, f"cannot run: {exc}",
                             "ALGORITHM:FEEDBACK, FEEDBACK one of auto, none, fp32, bf16, int8 "
                             "that the algorithm takes") from None  # fmt: skip


def _convergence_algorithms(flag: str, value: Any, args: argparse.Namespace) -> None:
    """``bench convergence --algorithms``: names (``all``), ``NAME:FEEDBACK`` under --fsdp,
    each feedback option one the algorithm takes; and no plan in the FSDP2 mode."""
    from hipress.bench.powersgd_rows import NAMES  # PowerSGD: hipress's and PyTorch's hook
    from hipress.compll import load
    from hipress.fsdp import FsdpError
    from hipress.fsdp.feedback import resolve_feedback

    Names(lambda: [*_algorithms(), *NAMES], "algorithm", extra=("all",), colon=True,
          empty=bool(getattr(args, "rows", ""))).check(flag, value, args)  # fmt: skip
    entries = [w.strip() for w in value.split(",") if w.strip() and w.strip() != "all"]
    colon = [e for e in entries if ":" in e]
    if colon and not args.fsdp:
        raise UsageError(flag, colon[0], "needs --fsdp", "names (CaSync runs each algorithm "
                         "with its own feedback)")  # fmt: skip
    if not args.fsdp:
        return
    if args.plan != "default" or args.include:
        flag, value = ("--plan", args.plan) if args.plan != "default" else ("--include", args.include)
        raise UsageError(flag, value, "is CaSync's, not the FSDP2 mode's", "none with --fsdp")
    for e in entries or _algorithms():
        alg, _, fb = e.partition(":")
        try:
            resolve_feedback(load(alg, backend="reference"), fb or args.fsdp_feedback)
        except FsdpError as exc:
            where = (flag, e) if fb else ("--fsdp-feedback", args.fsdp_feedback)
            raise UsageError(*where, f"cannot run {alg}: {exc}",
                             "auto, none, fp32, bf16, int8 where the algorithm takes it") from None  # fmt: skip


def _local_steps(flag: str, value: Any, args: argparse.Namespace) -> None:
    """``--local-steps``: names of local-step rows (:func:`hipress.bench.diloco.parse_variants`)."""
    from hipress.bench.diloco import VARIANT_FORMS, parse_variants

    names = getattr(args, "algorithms", "").split(",")
    algorithms = tuple(a.strip() for a in names if a.strip() not in ("", "all"))
    for v in (w.strip() for w in value.split(",") if w.strip()):
        try:
            parse_variants([v], algorithms)
        except ValueError as exc:
            problem = str(exc).partition(": ")[2].partition("; write ")[0]
            problem = problem.replace("not a", "is not a", 1)
            raise UsageError(flag, v, problem, VARIANT_FORMS) from None


def _one_step(flag: str, value: Any, args: argparse.Namespace) -> None:
    """``bench convergence``'s epoch holds at least one step of every worker's batch."""
    from hipress.bench.convergence_options import TASKS

    Int(1, 10**9).check(flag, value, args)
    spec = TASKS[args.task]
    lm = spec.window > 0
    if lm != (flag == "--train-tokens"):
        return  # the other task's option
    per_step = args.workers * (args.batch or spec.batch)
    have = (value - 1) // spec.window if lm else value
    if have < per_step:
        need = per_step * spec.window + 1 if lm else per_step
        raise UsageError(flag, value, f"is less than one step of {args.workers} workers x "
                         f"{args.batch or spec.batch} {'windows' if lm else 'samples'}",
                         f"at least {need} for --task {args.task}")  # fmt: skip


def _e2e_warmup(flag: str, value: Any, args: argparse.Namespace) -> None:
    Int(3, 10_000).check(flag, value, args)  # PowerSGD's baseline starts at step 2


def _bucket_caps(flag: str, value: Any, args: argparse.Namespace) -> None:
    from hipress.bench.e2e_caps import parse_caps

    try:
        parse_caps(value)
    except ValueError as exc:
        allowed = "default, auto or MB above 0 to 1e6, comma-separated"
        raise UsageError(flag, str(exc), "is not a bucket cap", allowed) from None


def _report_paths(flag: str, value: Any, args: argparse.Namespace) -> None:
    if "\0" in value:
        raise UsageError(flag, value, "holds a NUL character", "a path")
    if flag == "--results" and not Path(value).is_dir():
        raise UsageError(flag, value, "is not a directory", "a folder of <bench>.json files")
    if flag == "--docs":
        if not Path(value).is_file():
            raise UsageError(flag, value, "is no such file", "the markdown file to update")
        if not args.check:
            check_out(flag, value, "file")


WORKERS = Int(2, max_workers, allowed=workers_allowed)
THREADS = Int(1, cpus, allowed=lambda: f"an integer from 1 to {cpus()} (this machine's CPUs)")
RATES = Num(0.001, 1e6, none=True, unit=" Mbit/s (1kbit to 1tbit), or loopback")
BUDGET = Num(0.0, 86_400.0, open_lo=True, unit=" seconds")
ALGORITHMS = Names(_algorithms, "algorithm")
BACKEND = Names(_backends, "backend")
STEPS = Int(1, 1_000_000)
DIM = Int(1, 65_536, none=True)
_COMMON: dict[str, Rule] = {"threads": THREADS, "out": _out("dir"), "name": Call(_name)}


def _table() -> dict[tuple[str, ...], dict[str, Rule]]:
    link: dict[str, Rule] = {
        "bandwidth": Num(125.0, 1.25e13, none=True, unit=" bytes/s (1kbit to 100tbit)"),
        "latency": Num(0.0, 10.0, none=True, unit=" seconds"),
        "algorithm": Call(_algorithm_params), "backend": BACKEND, "budget": BUDGET,
        "threads": Int(1, cpus, none=True), "out": _out("file"),
    }  # fmt: skip
    return {
        ("bench", "kernels"): {
            "device": Call(_device), "sizes": Call(_kernel_sizes),
            "algorithms": Call(_kernel_algorithms), "reps": Int(1, 10_000), "out": _out("file")},
        ("bench", "sync"): {
            "workers": WORKERS, "sizes": Int(8, MAX_SYNC_BYTES), "algorithms": ALGORITHMS,
            "partitions": Int(1, 1024), "reps": Int(1, 10_000), "budget": BUDGET,
            "rates": RATES, "threads": THREADS, "backend": BACKEND, "out": _out("file"),
        },
        ("bench", "e2e"): {
            **_COMMON, "workers": WORKERS, "rates": RATES,
            "models": Names(_workloads, "model"), "plan": Call(partial(_plan, several=True)),
            "algorithms": Names(_e2e_algorithms, "algorithm"), "bucket_cap_mb": Call(_bucket_caps),
            "steps": STEPS, "warmup": Call(_e2e_warmup), "repeats": Int(1, 100),
            "powersgd_rank": Int(1, 1024), "local_steps": Call(_local_steps),
            "rows": Names(lambda: [*_algorithms(), "none"], "algorithm", empty=True),
            "include": Call(name_patterns)},
        ("bench", "convergence"): {
            **_COMMON, "workers": WORKERS, "plan": Call(_plan),
            "algorithms": Call(_convergence_algorithms), "epochs": Int(1, 10_000),
            "seeds": Int(1, 100), "train_tokens": Call(_one_step),
            "train_samples": Call(_one_step), "batch": Int(1, 65_536, none=True),
            "lr": Num(0.0, 1e3, open_lo=True, none=True), "warmup_steps": Int(0, 10**7),
            "warmup_epochs": Num(0.0, 1e4), "density_warmup_epochs": Int(0, 10_000),
            "clip": Num(0.0, 1e9, none=True), "local_epochs": Int(1, 10_000, none=True),
            "fsdp_feedback": Names(lambda: ("auto", "none", "fp32", "bf16", "int8"), "option"),
            "local_steps": Call(_local_steps), "rate_mbit": RATES,
            "rows": Names(lambda: [*_algorithms(), "none"], "algorithm", empty=True),
            "include": Call(name_patterns),
        },
        ("bench", "fsdp"): {
            **_COMMON, "workers": WORKERS, "rates": RATES, "model": Names(_workloads, "model"),
            "variants": Call(_variants), "steps": STEPS, "warmup": Int(1, 10_000),
            "repeats": Int(1, 100),
        },
        ("bench", "robustness"): {
            **_COMMON, "workers": WORKERS, "steps": STEPS,
            "algorithms": Names(_algorithms, "algorithm", extra=("all",)),
            "optimizers": Names(_optimizers, "optimizer"),
        },
        ("bench", "costfit"): {"budget": BUDGET, "out": _out("file")},
        ("bench", "ring"): {
            "profiles": Call(_profile), "latency": Num(0.0, 10.0, unit=" seconds"),
            "out": _out("file"),
        },
        ("bench", "report"): {"results": Call(_report_paths), "docs": Call(_report_paths)},
        ("bench", "plan"): {
            "model": Call(_model_spec), "algorithm": Call(_algorithm_params), "backend": BACKEND,
            "nproc": WORKERS, "threads": THREADS, "rate_mbit": RATES, "steps": STEPS,
            "warmup": Int(0, 10_000), "budget": BUDGET, "plans": Names(_plans, "plan"),
            "json_out": _out("file"),
        },
        ("plan",): {
            **link, "model": Call(_model_spec),  # --workers, --profile, --overlap, --include,
            # --exclude: the command checks them itself, before any work
            "max_partitions": Int(1, 1024, none=True), "row_density": Num(0.0, 1.0, none=True),
            "bucket_cap_mb": Num(0.0, 1e6, open_lo=True, none=True), "png": Call(check_png),
            "algorithm": Call(_plan_algorithm),
        },
        ("profile",): {**link, "workers": WORKERS, "model": Call(_model_spec)},  # --overlap: the command
        ("demo",): {
            **_COMMON, "workers": Int(1, max_workers, allowed=lambda: workers_allowed(1)),
            "threads": Int(0, cpus, allowed=lambda: f"0 (auto) or 1 to {cpus()}"),
            "steps": STEPS, "algorithm": Call(_algorithm_params), "plan": Call(_plan),
            "net_mbit": Num(0.001, 1e6, none=True, also=(0.0,), unit=" Mbit/s, loopback"),
            "batch": DIM, "seq_len": Int(2, 65_536, none=True), "vocab": Int(16, 1 << 20),
            "emb_dim": DIM, "hidden": DIM, "layers": Int(1, 64, none=True),
            "lr": Num(0.0, 1e3, open_lo=True), "seed": Int(0, 2**63 - 1),
            "timeout": Num(0.0, 7 * 86_400.0, open_lo=True, unit=" seconds"),
        },
    }  # fmt: skip


def _optimizers() -> tuple[str, ...]:
    from hipress.bench.robustness import OPTIMIZERS

    return OPTIMIZERS


def _plans() -> tuple[str, ...]:
    from hipress.bench.prediction import PLANS

    return PLANS


# built once at import; the rules call into the benchmark modules only when they run
RULES: dict[tuple[str, ...], dict[str, Rule]] = _table()
