"""IFEval prompt files: one JSON object a line, ``{"key", "prompt", "instruction_id_list", "kwargs"}``,
exactly as Google's ``input_data.jsonl``. A file is checked whole when it is read: a row with an unknown
instruction id or arguments its checker cannot take is refused with its line number, so a typo in a
data file fails at load time instead of silently scoring every response 0."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SBoNError
from .checkers import Instruction, build

# The shipped prompts: 400 of IFEval's 541 (source and license in benchmarks/data/README.md).
SHIPPED_FILE = Path(__file__).resolve().parents[1] / "assets" / "ifeval" / "ifeval_prompts.jsonl"


@dataclass(frozen=True)
class IFEvalPrompt:
    key: int = field(metadata={"help": "IFEval's id of the prompt"})
    prompt: str = field(metadata={"help": "the prompt text, instructions included"})
    instruction_ids: tuple[str, ...] = field(metadata={"help": "e.g. ('punctuation:no_comma',)"})
    kwargs: tuple[dict, ...] = field(metadata={"help": "each instruction's arguments, same order"})

    def instructions(self) -> list[Instruction]:
        return [build(i, k) for i, k in zip(self.instruction_ids, self.kwargs)]


def is_calibration(key: int) -> bool:
    """The calibration split: prompts with an odd key estimate the open pass rates
    (``python -m sbon.ifeval.calibrate``); prompts with an even key are left for evaluation."""
    return key % 2 == 1


def parse_row(row: object, where: str) -> IFEvalPrompt:
    """One row, checked: every instruction must build (known id, arguments of the right type)."""
    if not isinstance(row, dict) or not {"prompt", "instruction_id_list", "kwargs"} <= set(row):
        raise SBoNError(f"{where}: expected an object with prompt, instruction_id_list and kwargs")
    ids, kwargs = row["instruction_id_list"], row["kwargs"]
    if not isinstance(ids, list) or not isinstance(kwargs, list) or len(ids) != len(kwargs):
        raise SBoNError(f"{where}: instruction_id_list and kwargs must be lists of the same length")
    if not all(isinstance(k, dict) for k in kwargs):
        raise SBoNError(f"{where}: each kwargs entry must be an object")
    try:
        for i, k in zip(ids, kwargs):
            build(i, k)
    except SBoNError as e:
        raise SBoNError(f"{where}: {e}") from None
    return IFEvalPrompt(int(row.get("key", -1)), str(row["prompt"]), tuple(ids), tuple(kwargs))


def load_prompts(path: str | Path = SHIPPED_FILE) -> list[IFEvalPrompt]:
    """All rows of an IFEval prompt file, each checked (SBoNError naming file and line otherwise)."""
    path = Path(path)
    if not path.exists():
        raise SBoNError(f"IFEval prompt file not found: {path}")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SBoNError(f"{path.name} line {n}: not JSON ({e.msg})") from None
        rows.append(parse_row(row, f"{path.name} line {n}"))
    return rows
