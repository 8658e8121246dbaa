"""Command-line options made from a settings dataclass: one `--option` per field, with the field's
default, help and choices (see ``sbon.config.setting``). The CLI and the recording script build
their options here, so a new RunConfig field reaches both without being written again.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Callable, Iterable


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, defaults: Any, *,
                skip: Iterable[str] = (), only: Iterable[str] | None = None,
                overrides: dict[str, dict[str, Any]] | None = None, show_default: bool = True) -> None:
    """Add ``--field-name`` for each field of the dataclass instance ``defaults`` (its values are the
    defaults), or for the fields named in ``only``. Booleans get ``--x/--no-x``; ``int | None`` fields
    take a number or ``none``. ``overrides`` replaces argparse keywords of single options (e.g. a type
    that also takes 'auto', or a default that another option decides; its "help" is added to the field's, and
    where it says "default: ...", that is the default shown).
    ``show_default=False`` for parsers whose formatter shows defaults itself."""
    hints = typing.get_type_hints(type(defaults))
    metadata = _metadata(type(defaults))
    skip, overrides = set(skip), overrides or {}
    only = None if only is None else list(only)
    fields = {f.name: f for f in dataclasses.fields(defaults)}
    for f in ([fields[name] for name in only] if only is not None else fields.values()):
        if f.name in skip:
            continue
        default = getattr(defaults, f.name)
        kind, optional = field_kind(hints[f.name])
        meta = metadata.get(f.name, {})
        override = dict(overrides.get(f.name, {}))
        help_text = meta.get("help", "")
        if "help" in override:  # a suffix to the field's own help, before the default it shows
            help_text = f"{help_text} ({override.pop('help')})"
        if show_default and "(default" not in help_text:
            help_text = f"{help_text} (default: {_show(override.get('default', default))})"
        kwargs: dict[str, Any] = {"default": default, "help": help_text}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _optional(kind) if optional else kind
        choices = meta.get("choices")
        if choices is not None:
            kwargs["choices"] = choices()
        kwargs.update(override)
        parser.add_argument("--" + f.name.replace("_", "-"), **kwargs)


def resolved(action: argparse.Action, default: Callable[[], Any]) -> argparse.Action:
    """Mark an option whose default (None to argparse) the code resolves after parsing: ``default()`` is what
    that code gives on this machine, and ``HelpFormatter`` shows it, so the help cannot drift from the code."""
    action.resolved_default = default
    return action


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default shown once: what argparse fills in, or for an option marked ``resolved``, what the
    code resolves it to here. A help text that describes its own default keeps it (and nothing is added)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        resolve = getattr(action, "resolved_default", None)
        if resolve is None or "(default" in text:
            return super()._get_help_string(action) if "(default" not in text else text
        return f"{text} (default: {_show(resolve())})".replace("%", "%%")


def shown_default(parser: argparse.ArgumentParser, action: argparse.Action) -> str | None:
    """The default the help shows for ``action`` (the text of its "(default: ...)"), or None."""
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    start = text.find("(default")
    return None if start < 0 else text[start:].partition(":")[2].strip().removesuffix(")").strip() or ""


def values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The parsed values of ``cls``'s fields, by field name (options that were skipped are left out)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}


def _metadata(cls: type) -> dict[str, Any]:
    """Each field's help and choices, also where a subclass gave a field only a new default (a
    RunConfig subclass with the page's defaults keeps RunConfig's help)."""
    found: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            found.update({f.name: f.metadata for f in dataclasses.fields(base) if f.metadata})
    return found


def field_kind(hint: Any) -> tuple[type, bool]:
    """(the value's type, whether None is allowed) for hints like ``int``, ``int | None``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return inner[0], len(inner) < len(typing.get_args(hint))
    return hint, False


def _optional(kind: type):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)
    parse.__name__ = kind.__name__  # argparse names the type in its "invalid int value" message
    return parse


def _show(value: Any) -> str:
    return "none" if value is None else str(value)
