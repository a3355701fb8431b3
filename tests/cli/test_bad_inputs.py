"""Every subcommand of the ``fastload`` command against a table of bad inputs: each ends with exit
status 2 and one line on stderr naming what was wrong (never a traceback, never a file's bytes).
Run in-process through the command's entry point (an uncaught exception fails the test as it is)."""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from fastload.cli.command import build_parser, main
from fastload.converters import ConvertOptions, convert
from tests.conftest import photo_folder


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A good dataset (``ds``, 12 photos) and, beside it, damaged files of every kind the commands read."""
    root = tmp_path_factory.mktemp("bad-inputs")
    convert(str(photo_folder(root / "raw", 12, (24, 32))), str(root / "ds"), ConvertOptions(source="imagefolder", samples_per_shard=6))
    good = '{"where": "a.jpg", "reason": "bad"}\n'
    for name, text in (("skip-json", good + "{not json\n"), ("skip-list", '["where", "reason"]\n'), ("skip-fields", good + '{"where": 1}\n')):
        shutil.copytree(root / "ds", root / name)
        (root / name / "skipped.jsonl").write_text(text)
    shutil.copytree(root / "ds", root / "bad-index")
    (root / "bad-index" / "index.json").write_text("{not json")
    cifar = root / "cifar" / "cifar-10-batches-py"
    cifar.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (cifar / name).write_bytes(b"\x80\x02JUNK-BYTES, not a pickle")
    cifar_meta = root / "cifar-meta" / "cifar-10-batches-py"
    shutil.copytree(cifar, cifar_meta)
    (cifar_meta / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"a"]}, protocol=2))
    cifar_rows = root / "cifar-rows" / "cifar-10-batches-py"
    shutil.copytree(cifar, cifar_rows)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (cifar_rows / name).write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, protocol=2))
    (root / "raw.npz").write_bytes(b"PK\x03\x04 a cut zip")
    (root / "empty").mkdir()
    (root / "junk-tars").mkdir()
    (root / "junk-tars" / "a.tar").write_bytes(b"not a tar" * 100)
    (root / "damaged.pt").write_bytes(b"JUNK-BYTES")
    (root / "damaged.json").write_bytes(b"\xff\xfe{")
    (root / "no-seed.json").write_text(json.dumps({"version": 3, "epoch": 0, "samples_consumed": 0}))
    (root / "bad-epoch.json").write_text(json.dumps({"version": 3, "seed": 0, "epoch": "x", "samples_consumed": 0,
                                                     "shuffle": True, "shuffle_buffer": None}))
    torch.save({"model": [1, 2]}, root / "no-state.pt")
    (root / "take-out.txt").write_text("1\n99\n")
    (root / "take-words.txt").write_text("one\ntwo\n")
    (root / "exclude-unknown.txt").write_text("no-such-key\n")
    (root / "a-file").write_text("x")
    return root


CASES: dict[str, Callable[[Path], list[str]]] = {
    "convert: no such source": lambda r: ["convert", str(r / "missing"), str(r / "o1"), "--from", "imagefolder"],
    "convert: a CIFAR batch that is not a pickle": lambda r: ["convert", str(r / "cifar-meta" / "cifar-10-batches-py"), str(r / "o2"), "--from", "cifar"],
    "convert: a CIFAR meta that is not a pickle": lambda r: ["convert", str(r / "cifar" / "cifar-10-batches-py"), str(r / "o3"), "--from", "cifar"],
    "convert: CIFAR rows of the wrong size": lambda r: ["convert", str(r / "cifar-rows" / "cifar-10-batches-py"), str(r / "o4"), "--from", "cifar"],
    "convert: a cut npz": lambda r: ["convert", str(r / "raw.npz"), str(r / "o5"), "--from", "npz"],
    "convert: a shard size that is not one": lambda r: ["convert", str(r / "raw"), str(r / "o6"), "--from", "imagefolder", "--shard-size", "lots"],
    "index: no such folder": lambda r: ["index", str(r / "missing")],
    "index: no tars": lambda r: ["index", str(r / "empty")],
    "index: a tar that is not one": lambda r: ["index", str(r / "junk-tars")],
    "inspect: no dataset": lambda r: ["inspect", str(r / "missing")],
    "inspect: skipped.jsonl not JSON": lambda r: ["inspect", str(r / "skip-json")],
    "inspect: skipped.jsonl of a list": lambda r: ["inspect", str(r / "skip-list")],
    "inspect: skipped.jsonl without its fields": lambda r: ["inspect", str(r / "skip-fields")],
    "inspect: index.json not JSON": lambda r: ["inspect", str(r / "bad-index")],
    "verify: no dataset": lambda r: ["verify", str(r / "missing")],
    "verify: index.json not JSON": lambda r: ["verify", str(r / "bad-index"), "--decode"],
    "overlap: no A": lambda r: ["overlap", str(r / "missing"), str(r / "ds")],
    "overlap: no B": lambda r: ["overlap", str(r / "ds"), str(r / "bad-index")],
    "describe: a checkpoint that is not one": lambda r: ["describe", str(r / "ds"), "--step", "0", "--state", str(r / "damaged.pt")],
    "describe: a JSON state that is not JSON": lambda r: ["describe", str(r / "ds"), "--step", "0", "--state", str(r / "damaged.json")],
    "describe: a checkpoint without a loader state": lambda r: ["describe", str(r / "ds"), "--step", "0", "--state", str(r / "no-state.pt")],
    "describe: a state without seed": lambda r: ["describe", str(r / "ds"), "--step", "0", "--state", str(r / "no-seed.json")],
    "describe: a state whose epoch is no number": lambda r: ["describe", str(r / "ds"), "--step", "0", "--state", str(r / "bad-epoch.json")],
    "describe: --step past the end": lambda r: ["describe", str(r / "ds"), "--step", "99"],
    "describe: a negative --step": lambda r: ["describe", str(r / "ds"), "--step", "-1"],
    "describe: --take out of range": lambda r: ["describe", str(r / "ds"), "--step", "0", "--take", str(r / "take-out.txt")],
    "describe: --take of words": lambda r: ["describe", str(r / "ds"), "--step", "0", "--take", str(r / "take-words.txt")],
    "describe: --take missing": lambda r: ["describe", str(r / "ds"), "--step", "0", "--take", str(r / "missing.txt")],
    "describe: --exclude of an unknown key": lambda r: ["describe", str(r / "ds"), "--step", "0", "--exclude", str(r / "exclude-unknown.txt")],
    "describe: --class-weights of an unknown class": lambda r: ["describe", str(r / "ds"), "--step", "0", "--balanced", "--class-weights", '{"gnu": 1}'],
    "bench: no dataset": lambda r: ["bench", str(r / "missing")],
    "demo: a workdir that is a file": lambda r: ["demo", "--workdir", str(r / "a-file"), "--images", "3"],
}


def test_the_table_covers_every_subcommand() -> None:
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert {args(Path("x"))[0] for args in CASES.values()} == commands


@pytest.mark.parametrize("case", CASES)
def test_a_bad_input_is_exit_status_2_and_one_line(bad: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = CASES[case](bad)
    status = main(args)
    err = capsys.readouterr().err
    assert status == 2, err
    assert len(err.splitlines()) == 1 and err.startswith(f"fastload {args[0]}: error: "), err
    assert "Traceback" not in err and "JUNK-BYTES" not in err and "not a tar" not in err  # never a file's bytes


def test_a_malformed_skipped_report_is_named_by_file_and_line(bad: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(bad / "skip-json")]) == 2
    assert capsys.readouterr().err.strip().endswith("skip-json/skipped.jsonl: line 2 is not a skipped-sample entry "
                                                    "(a JSON object with 'where' and 'reason' strings)")
