"""One ``fastload.DataLoader`` for every kind of batch, and its typed public face: a token loader is
a ``fastload.DataLoader``; each kind refuses the other's arguments by name; ``TokenDataLoader`` is a
deprecation alias; a user's mypy sees the loader's signature through ``py.typed`` and the package's
``TYPE_CHECKING`` imports (checked by running mypy on a user's script against the package as installed)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch

import fastload
from tests.text.test_token_loader import SEQ, tokens  # noqa: F401 - a fixture

REPO = Path(__file__).resolve().parents[2]


def test_a_token_loader_is_a_fastload_dataloader_with_torchs_attributes(tokens: Path) -> None:  # noqa: F811
    loader = fastload.DataLoader(tokens, batch_size=4, seq_len=SEQ, seed=1)
    assert isinstance(loader, fastload.DataLoader) and isinstance(loader, torch.utils.data.DataLoader)
    assert loader.seq_len == SEQ and loader.shuffle and loader.backend == "cpu"  # token rows are shuffled unless asked otherwise
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (4, SEQ) and batch["labels"].shape == (4, SEQ)
    assert [len(b) for b in loader.batch_sampler][:2] == [4, 4]
    loader.close()


def test_each_kind_refuses_the_other_kinds_arguments_by_name(tokens: Path, clean: Path) -> None:  # noqa: F811
    with pytest.raises(ValueError, match=r"seq_len= loads packed token rows: transform=, return_keys= apply to samples"):
        fastload.DataLoader(tokens, seq_len=SEQ, transform=fastload.transforms.val(32), return_keys=True)
    with pytest.raises(ValueError, match=r"collate_fn= apply to samples"):
        fastload.DataLoader(tokens, seq_len=SEQ, collate_fn=lambda batch: batch)
    with pytest.raises(ValueError, match=r"packing=, batch_format= set how token rows are packed: give seq_len="):
        fastload.DataLoader(clean, packing="best-fit", batch_format="transformers")
    fastload.DataLoader(tokens, seq_len=SEQ, rank=0, world_size=2, device="cpu").close()  # what both kinds take


def test_token_data_loader_is_a_deprecated_alias_of_dataloader(tokens: Path) -> None:  # noqa: F811
    with pytest.warns(DeprecationWarning, match=r"fastload.TokenDataLoader is deprecated.*DataLoader\(dataset, seq_len=\.\.\.\)"):
        alias = fastload.TokenDataLoader
    assert alias is fastload.DataLoader
    loader = alias(tokens, batch_size=2, seq_len=SEQ)
    assert isinstance(loader, fastload.DataLoader) and next(iter(loader))["input_ids"].shape == (2, SEQ)
    loader.close()


def test_all_names_what_the_package_exports() -> None:
    exported = {name for name in fastload.__all__ if name != "__version__"}
    assert exported == set(fastload._EXPORTS)
    assert all(getattr(fastload, name) is not None for name in exported)


USER_SCRIPT = """
import fastload
from fastload import transforms as T

loader = fastload.DataLoader("shards/", batch_size=8, num_workers=2, transform=T.train(224))
tokens = fastload.DataLoader("tokens/", batch_size=4, seq_len=2048, packing="best-fit")
state: dict = tokens.state_dict()
{bad}
"""


def user_mypy(tmp_path: Path, bad: str) -> subprocess.CompletedProcess:
    """mypy on a user's script, with fastload as an installed package (a site-packages of its own
    holding fastload: mypy then reads it only through py.typed, as a user's mypy does)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (purelib / "fastload").symlink_to(REPO / "fastload")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(USER_SCRIPT.format(bad=bad)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    return subprocess.run([sys.executable, "-m", "mypy", "--python-executable", str(venv / "bin" / "python"), "--ignore-missing-imports",
                           "--no-implicit-reexport", "--no-incremental", "--cache-dir", os.devnull, str(script)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_a_users_mypy_sees_the_loaders_signature(tmp_path: Path) -> None:
    good = user_mypy(tmp_path / "good", "")
    assert good.returncode == 0, good.stdout + good.stderr
    bad = user_mypy(tmp_path / "bad", 'fastload.DataLoader("tokens/", seq_len="2048")\nfastload.DataLoader("shards/", shufle=True)')
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert 'Argument "seq_len" to "DataLoader" has incompatible type "str"' in bad.stdout
    assert 'Unexpected keyword argument "shufle" for "DataLoader"' in bad.stdout
