"""Built-in model specs, ``file.py:NAME`` / ``module:NAME`` references, and modules built from
specs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from hipress.secopa.model.specs import (
    ModelSpecError,
    builtin_models,
    module_from_spec,
    resolve_model,
    spec_of_module,
)


def make_net() -> nn.Module:
    """A factory ``resolve_model`` imports as ``test_secopa_specs:make_net``."""
    return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2, bias=False))


NOT_A_MODULE = 42


@pytest.mark.parametrize(
    ("name", "tensors", "numel"),
    [
        ("resnet50", 161, 25_557_032),  # torchvision's counts
        ("vgg19", 38, 143_667_240),
        ("bert-base", 199, 109_482_240),
        ("lstm-lm", 11, 119_243_600),
        ("mlp", 8, 4_462_346),
    ],
)
def test_builtin_specs_match_the_real_models(name: str, tensors: int, numel: int) -> None:
    spec = resolve_model(name)
    assert len(spec.params) == tensors and spec.numel == numel
    assert len({n for n, _ in spec.params}) == tensors  # unique names


def test_builtin_names_are_listed() -> None:
    assert builtin_models() == ["bert-base", "lstm-lm", "mlp", "resnet50", "vgg19"]


def test_module_attr_import_of_a_factory_and_a_class() -> None:
    spec = resolve_model("test_secopa_specs:make_net")
    assert spec.named_numels() == [("0.weight", 32), ("0.bias", 4), ("2.weight", 8)]
    assert resolve_model("torch.nn:Identity").params == ()


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("resnet51", "unknown model 'resnet51': use one of"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("torch.nn:NoSuchThing", "has no attribute 'NoSuchThing'"),
        ("torch.nn:Linear", "calling it without arguments failed"),
        ("test_secopa_specs:NOT_A_MODULE", "not an nn.Module or factory"),
        (":x", "expected module:attr"),
    ],
)
def test_bad_model_references_say_what_is_wrong(ref: str, message: str) -> None:
    with pytest.raises(ModelSpecError, match=message):
        resolve_model(ref)


def test_module_from_spec_has_the_same_parameters_and_gradients() -> None:
    spec = resolve_model("mlp")
    module = module_from_spec(spec)
    assert spec_of_module("mlp", module).params == spec.params
    module(torch.ones(3)).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


MODEL_FILE = """
from torch import nn


class Net(nn.Module):
    def __init__(self, width: int = 6) -> None:
        super().__init__()
        self.fc = nn.Linear(3, width)


class Wide(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(3, width)


def make_wide() -> nn.Module:
    return Wide(10)
"""


def test_a_file_path_or_a_module_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").write_text(MODEL_FILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    want = [("fc.weight", 18), ("fc.bias", 6)]
    assert resolve_model("train.py:Net").named_numels() == want
    assert resolve_model("./train.py:Net").named_numels() == want
    assert resolve_model(f"{tmp_path}/train.py:make_wide").named_numels()[1] == ("fc.bias", 10)
    assert resolve_model("train:Net").named_numels() == want  # a module, from the cwd
    assert str(tmp_path) not in sys.path and "" not in sys.path  # left as it was


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("train.py:Wide", r"calling it without arguments failed .*zero-argument factory"),
        ("missing.py:Net", "no such file"),
        ("broken.py:Net", "running 'broken.py' failed: ZeroDivisionError"),
        ("train.py:Nope", "has no attribute 'Nope'"),
    ],
)
def test_file_references_say_what_a_factory_must_look_like(
    ref: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").write_text(MODEL_FILE)
    (tmp_path / "broken.py").write_text("1 / 0\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSpecError, match=message):
        resolve_model(ref)


def test_the_console_script_plans_a_model_from_a_file(tmp_path: Path) -> None:
    # the installed `hipress` script, whose sys.path lacks the current directory
    (tmp_path / "train.py").write_text(MODEL_FILE)
    script = Path(sys.executable).with_name("hipress")
    for ref in ("train.py:Net", "./train.py:Net", "train:make_wide"):
        r = subprocess.run(
            [str(script), "plan", "--model", ref, "--workers", "4", "--bandwidth", "1gbit",
             "--budget", "0.1", "--threads", "1", "--json"],
            cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert '"fc.weight"' in r.stdout
