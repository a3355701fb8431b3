"""A modality is a folder (docs/architecture.md, "Where a change goes": a new modality): audio, the
proof, lives in fastload/av/ and, outside it, in its registry rows alone. The check reads the code
itself (names, imports and string values, not comments, docstrings nor a flag's help text) of every module outside
fastload/av/ and finds those that name audio; import-linter's contract "A modality is a folder"
keeps the same modules from importing audio's own."""

from __future__ import annotations

import ast
from pathlib import Path

from fastload.media import MEDIA_ROLES

PACKAGE = Path(__file__).resolve().parents[1] / "fastload"
# the registry rows outside the modality's folder a media role may take, as docs/architecture.md lists them
ROWS = {
    "its role, extensions and codec; its row of the media roles": ("fields.py", "media.py"),
    "its --from source": ("converters/sources/__init__.py", "converters/sources/audio.py"),
    "its typed public keywords": ("loader.py", "__init__.py", "converters/convert_options.py"),
}


def _prose(tree: ast.Module) -> set[int]:
    """The ids of the string constants that are prose: docstrings (a module's, a class's, a
    function's) and a command-line flag's ``help=`` text."""
    owners = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))]
    docstrings = {id(owner.body[0].value) for owner in owners
                  if owner.body and isinstance(owner.body[0], ast.Expr) and isinstance(owner.body[0].value, ast.Constant)}
    helps = {id(part) for node in ast.walk(tree) if isinstance(node, ast.keyword) and node.arg == "help" for part in ast.walk(node.value)}
    return docstrings | helps


def code_names(path: Path) -> set[str]:
    """Every identifier, imported name and string value of a module's code (not its comments, docstrings nor flags' help)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = _prose(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.arg, ast.keyword)):
            names.add(node.arg or "")
        elif isinstance(node, ast.alias):
            names.update((node.name, node.asname or ""))
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            names.add(node.value)
    return names


def modules_naming(word: str) -> set[str]:
    """The modules outside fastload/av/ whose code names ``word`` (in any case, within a longer name too)."""
    return {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
            if path.relative_to(PACKAGE).parts[0] != "av" and any(word in name.lower() for name in code_names(path))}


def test_audio_is_named_outside_its_folder_only_by_its_registry_rows() -> None:
    assert "audio" in MEDIA_ROLES
    allowed = {module for modules in ROWS.values() for module in modules}
    found = modules_naming("audio")
    assert found - allowed == set(), f"modules outside fastload/av/ that name audio but are none of its rows {ROWS}"
    assert found == allowed, f"rows that no longer name audio (update ROWS and docs/architecture.md): {sorted(allowed - found)}"


def test_the_check_sees_a_name_in_code_and_not_in_prose(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Audio here is prose."""\n# audio in a comment\ndef f(x):\n    """audio again."""\n    return x\n')
    assert not any("audio" in name.lower() for name in code_names(module))
    module.write_text('p.add_argument("--caption-column", help="audio manifest: its column of transcripts")\n')
    assert not any("audio" in name.lower() for name in code_names(module))
    module.write_text('def f(options):\n    return options.audio_rate\n')
    assert "audio_rate" in code_names(module)
    module.write_text('ROLES = ("image", "audio")\n')
    assert "audio" in code_names(module)
