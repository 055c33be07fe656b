"""Bug variants of the examples: the example's own source with one deliberate change, written
to a temporary folder (beside a copy of the model file it imports), so a variant is always
exactly "the example plus this bug"."""

from __future__ import annotations

import shutil
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: Files a target imports from its own folder.
COMPANIONS = {"train_gpt.py": ("gpt_model.py",), "train_replicate.py": ("train_fsdp2.py",)}


def variant(tmp_path: Path, example: str, name: str, *edits: tuple[str, str]) -> str:
    """Write ``example`` with each ``(old, new)`` edit applied (``old`` must occur exactly once)
    as ``tmp_path/name/<example>``; returns its path. The file keeps the example's name, so
    the target's name in a message never carries the variant's (it would match any hint)."""
    text = (EXAMPLES / example).read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"{example}: {old!r} occurs {text.count(old)} times"
        text = text.replace(old, new)
    folder = tmp_path / name
    folder.mkdir()
    for companion in COMPANIONS.get(example, ()):
        shutil.copy(EXAMPLES / companion, folder / companion)
    path = folder / example
    path.write_text(text)
    return str(path)
