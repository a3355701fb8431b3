"""A small mutation-testing runner: plant one small bug (a mutant) at a time in a module, run the
module's fast tests against it, and list the mutants no test noticed (the survivors).

Why not mutmut or cosmic-ray: mutmut 3 runs mutants through trampolines selected in-process, so a
mutant never reaches the code our tests actually run in worker processes and ``fastload``
subprocesses; cosmic-ray needs a session database and a config per module. Here a mutant is
written into a scratch copy of the checkout, so worker processes and the CLI run it too, and each
mutant's tests run in a child forked from a process that has already imported torch, numpy and
pytest (about 3 s saved per mutant on this 2-core machine).

    python scripts/mutation.py fastload/orders/global_order.py -- tests/orders/test_orders.py
    python scripts/mutation.py fastload/converters/dedupe.py:find_duplicates -- tests/converters/test_sources.py -k dedupe

Mutations: comparison operators (``<`` / ``<=``, ``==`` / ``!=``, ``in`` / ``not in``, ...),
arithmetic and bitwise operators, ``and`` / ``or``, a dropped ``not`` or unary minus, an integer
constant plus one, ``True`` / ``False`` swapped. Annotations, docstrings, ``TYPE_CHECKING``
blocks and lines marked ``# pragma: no mutate`` are left alone.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPARE_SWAPS = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}
BINOP_SWAPS = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr,
    ast.LShift: ast.RShift, ast.RShift: ast.LShift,
}
SYMBOLS = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.In: "in",
    ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
    ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|",
    ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>", ast.And: "and", ast.Or: "or",
}


@dataclass(frozen=True)
class Site:
    """One place to mutate: the node's position in a walk of the tree, and what the mutant does."""

    walk_index: int
    line: int
    description: str


@dataclass
class Outcome:
    """A mutant's fate: killed (a test failed), timeout (counted as killed) or survived."""

    line: int
    description: str
    status: str
    seconds: float


def _skipped_nodes(tree: ast.Module, source_lines: list[str]) -> set[int]:
    """ids of nodes never mutated: annotations, docstrings, TYPE_CHECKING blocks, marked lines."""
    skipped: set[int] = set()

    def skip(node: ast.AST | None) -> None:
        for sub in ast.walk(node) if node is not None else ():
            skipped.add(id(sub))

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            skip(node.returns)
            for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs, node.args.vararg, node.args.kwarg]:
                skip(arg.annotation if arg is not None else None)
        elif isinstance(node, ast.AnnAssign):
            skip(node.annotation)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip(node)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                skip(first)
        line = getattr(node, "lineno", None)
        if line is not None and "pragma: no mutate" in source_lines[line - 1]:
            skip(node)
    return skipped


def _mutations(node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(description, replacement node) for each mutant of ``node`` itself."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in COMPARE_SWAPS:
                new = copy.copy(node)
                new.ops = [*node.ops[:i], COMPARE_SWAPS[type(op)](), *node.ops[i + 1 :]]
                yield f"{SYMBOLS[type(op)]} -> {SYMBOLS[COMPARE_SWAPS[type(op)]]}", new
    elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BINOP_SWAPS:
        new = copy.copy(node)
        new.op = BINOP_SWAPS[type(node.op)]()
        suffix = "=" if isinstance(node, ast.AugAssign) else ""
        yield f"{SYMBOLS[type(node.op)]}{suffix} -> {SYMBOLS[type(new.op)]}{suffix}", new
    elif isinstance(node, ast.BoolOp):
        new = copy.copy(node)
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield f"{SYMBOLS[type(node.op)]} -> {SYMBOLS[type(new.op)]}", new
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        yield f"drop {'not' if isinstance(node.op, ast.Not) else 'unary -'}", node.operand
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        yield f"{node.value} -> {not node.value}", ast.Constant(not node.value)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield f"{node.value} -> {node.value + 1}", ast.Constant(node.value + 1)


def _children(tree: ast.AST) -> Iterator[tuple[ast.AST, str, int | None, ast.AST]]:
    """(parent, field, list index or None, child) for every node, in a fixed walk order."""
    for parent in ast.walk(tree):
        for name, value in ast.iter_fields(parent):
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, ast.AST):
                        yield parent, name, i, item
            elif isinstance(value, ast.AST):
                yield parent, name, None, value


def _in_function(tree: ast.Module, name: str | None) -> set[int]:
    """ids of the nodes inside function ``name`` (all nodes when ``name`` is None)."""
    if name is None:
        return {id(n) for n in ast.walk(tree)}
    found = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    if not found:
        raise SystemExit(f"no function {name!r} in the module")
    return {id(n) for f in found for n in ast.walk(f)}


def find_sites(source: str, function: str | None = None) -> list[Site]:
    """Every mutant of ``source`` (only inside ``function`` if given), in a fixed order."""
    tree = ast.parse(source)
    skipped, wanted = _skipped_nodes(tree, source.splitlines()), _in_function(tree, function)
    sites = []
    for walk_index, (_, _, _, node) in enumerate(_children(tree)):
        if id(node) in skipped or id(node) not in wanted:
            continue
        for description, _ in _mutations(node):
            sites.append(Site(walk_index, node.lineno, description))
    return sorted(sites, key=lambda s: (s.line, s.walk_index))


def mutant_source(source: str, site: Site) -> str:
    """``source`` with the one mutation ``site`` describes applied."""
    tree = ast.parse(source)
    for walk_index, (parent, name, index, node) in enumerate(_children(tree)):
        if walk_index != site.walk_index:
            continue
        replacement = next(new for description, new in _mutations(node) if description == site.description)
        if index is None:
            setattr(parent, name, replacement)
        else:
            getattr(parent, name)[index] = replacement
        return ast.unparse(ast.fix_missing_locations(tree))
    raise LookupError(f"no node {site.walk_index}")


def scratch_copy(destination: Path) -> Path:
    """A copy of the checkout (code, tests, the compiled extension) without git, caches or venvs."""
    ignore = shutil.ignore_patterns(".git", "__pycache__", ".venv", "*.egg-info", "build", ".pytest_cache", ".mypy_cache", ".ruff_cache")
    shutil.copytree(REPO, destination, ignore=ignore, symlinks=True)
    return destination


def run_tests(root: Path, pytest_args: list[str], timeout: float) -> tuple[str, float]:
    """Run pytest on the copy at ``root`` in a forked child (its own process group, so a timeout
    ends its workers too); returns ("killed" | "survived" | "timeout", seconds)."""
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: import this copy's code fresh, run the tests, report by exit status
        os.setpgid(0, 0)
        os.chdir(root)
        sys.path.insert(0, str(root))
        os.environ["PYTHONPATH"] = str(root)
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"  # for the tests' subprocesses
        sys.dont_write_bytecode = True  # a mutant as long as the last, written in the same second, would pass a stale .pyc's check
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        import pytest

        os._exit(int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *pytest_args])))
    deadline = start + timeout
    try:
        while not (finished := os.waitpid(pid, os.WNOHANG))[0]:
            if time.monotonic() > deadline:
                return "timeout", time.monotonic() - start
            time.sleep(0.05)
    finally:  # a timeout, Ctrl-C or SIGTERM: end the child's group (and anything the tests left running)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # already reaped above
            pass
    code = os.waitstatus_to_exitcode(finished[1])
    return ("survived" if code == 0 else "killed"), time.monotonic() - start


def mutate_module(target: str, pytest_args: list[str], work: Path) -> list[Outcome]:
    """Run every mutant of ``target`` (``path`` or ``path:function``) against ``pytest_args``."""
    relative, _, function = target.partition(":")
    original = (REPO / relative).read_text()
    root = scratch_copy(work / "copy")
    status, baseline = run_tests(root, pytest_args, timeout=600)
    if status != "survived":
        raise SystemExit(f"{relative}: the tests fail (or hang) on the unmutated code; fix that first")
    timeout = 3 * baseline + 10
    sites = find_sites(original, function or None)
    print(f"{target}: {len(sites)} mutants, tests take {baseline:.1f} s unmutated", flush=True)
    outcomes = []
    for number, site in enumerate(sites, 1):
        (root / relative).write_text(mutant_source(original, site))
        status, seconds = run_tests(root, pytest_args, timeout)
        outcomes.append(Outcome(site.line, site.description, status, round(seconds, 1)))
        if status == "survived":
            print(f"  [{number}/{len(sites)}] SURVIVED {relative}:{site.line}: {site.description}", flush=True)
    (root / relative).write_text(original)
    return outcomes


def main() -> int:
    """Parse ``TARGET -- PYTEST ARGS``, run the mutants, print the survivors and the score."""
    if "--" not in sys.argv:
        print(__doc__, file=sys.stderr)
        return 2
    split = sys.argv.index("--")
    parser = argparse.ArgumentParser(description="Mutation testing of one module against its fast tests.")
    parser.add_argument("target", help="fastload/MODULE.py or fastload/MODULE.py:function")
    parser.add_argument("--json", type=Path, help="append the outcomes as one JSON line to this file")
    args = parser.parse_args(sys.argv[1:split])
    import numpy  # noqa: F401  imported once here; each forked mutant run reuses them

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the scratch copy is removed and the child ended

    with tempfile.TemporaryDirectory(prefix="fastload-mutation-") as work:
        outcomes = mutate_module(args.target, sys.argv[split + 1 :], Path(work))
    killed = sum(o.status != "survived" for o in outcomes)
    print(f"{args.target}: {killed} / {len(outcomes)} mutants killed ({sum(o.status == 'timeout' for o in outcomes)} by timeout)")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"target": args.target, "tests": sys.argv[split + 1 :], "outcomes": [asdict(o) for o in outcomes]}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
