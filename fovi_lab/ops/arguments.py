"""Command-line parsing shared by every ``python -m fovi_lab`` command: the parser class and the argument types.

:class:`CommandParser` is an ``argparse.ArgumentParser`` whose usage errors are one line on stderr (the command, the
argument and what was expected) with exit status 2, and whose help shows every option's default. The argument types
check a value as it is parsed, so a wrong value stops the command before any work starts: counts (integers >= 1),
positive numbers, layer names (``all`` where a command takes a list), backend names from the ops registry, devices,
and output files whose folder exists.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

__all__ = ["CommandParser", "HelpFormatter", "usage_error", "command_words", "int_at_least", "COUNT",
           "positive_float", "non_negative_float", "layer_name", "layer_names", "LayersAction", "expand_layers",
           "add_layer_source",
           "backend_name", "check_device", "device_name", "add_device_option", "device_kind", "out_file",
           "unwritable", "existing_file", "existing_folder"]


class HelpFormatter(argparse.HelpFormatter):
    """Help for the package's commands: a description's paragraphs are filled to the terminal's width, its indented
    lines (example command lines) kept as written, and every option's help ends with its default, unless the help
    already says it or the option is a flag."""

    def __init__(self, prog: str, **kwargs):
        kwargs.setdefault("max_help_position", 30)
        kwargs.setdefault("width", min(110, shutil.get_terminal_size((100, 24)).columns) - 2)
        super().__init__(prog, **kwargs)

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if action.help is not argparse.SUPPRESS:        # a command list: its names are indented one step further
            for sub in self._iter_indented_subactions(action):
                self._action_max_length = max(self._action_max_length,
                                              len(self._format_action_invocation(sub)) + self._current_indent)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in textwrap.dedent(text).strip("\n").split("\n\n"):
            lines = para.splitlines()
            if all(line.startswith("  ") for line in lines):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(textwrap.fill(" ".join(line.strip() for line in lines), width, initial_indent=indent,
                                         subsequent_indent=indent, break_on_hyphens=False))
        return "\n\n".join(out)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default is None or default is argparse.SUPPRESS or isinstance(default, bool)
                or "default" in text.lower() or "%(default)" in text):
            return text
        if isinstance(default, (list, tuple)):
            if not default:
                return text
            shown = " ".join(str(v) for v in default)
        else:
            shown = str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` for the package's commands: help with defaults (:class:`HelpFormatter`), and a usage
    error is one line on stderr, ``<command>: error: <argument>: <what was expected> (see --help)``, with exit
    status 2 (no usage dump, no traceback)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        text = " ".join(str(message).split())            # one line, whatever the message held
        if text.startswith("argument "):
            text = text[len("argument "):]
        self.exit(2, f"{self.prog}: error: {text} (see --help)\n")


def command_main(prog: str, description: str, add_arguments, run) -> Callable[..., int]:
    """A command's ``main(argv=None) -> int``: parse ``argv`` (default: the process's arguments) with a
    :class:`CommandParser` that ``add_arguments`` fills, keep the words in ``args.argv`` (for the records'
    ``command``) and return ``run(args)``; a usage error exits with status 2 and one line."""
    def main(argv=None) -> int:
        import sys

        parser = CommandParser(prog=prog, description=description)
        add_arguments(parser)
        args = parser.parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        return run(args)
    main.__doc__ = f"``{prog}``: see its description; a usage error exits with status 2."
    return main


def usage_error(prog: str, message: str):
    """Stop a command for a usage error found after parsing (one that needs the parsed values together): the one
    line :meth:`CommandParser.error` prints, exit status 2."""
    text = " ".join(str(message).split())
    print(f"{prog}: error: {text} (see --help)", file=sys.stderr)
    raise SystemExit(2)


def command_words(argv, *command: str) -> List[str]:
    """The words given to a command, for its records: ``argv`` when the command's ``main`` got it, else the
    process's arguments after the command's name (``python -m fovi_lab bench adjoints ...``)."""
    if argv is not None:
        return list(argv)
    words = list(sys.argv[1:])
    return words[len(command):] if words[:len(command)] == list(command) else words


# ------------------------------------------------------------------------------------------------ numbers

def int_at_least(low: int) -> Callable[[str], int]:
    """An argument type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


#: An argument type: a count (an integer >= 1).
COUNT = int_at_least(1)


def _float(text: str, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argument type: a finite number > 0."""
    value = _float(text, "a number > 0")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """An argument type: a finite number >= 0."""
    value = _float(text, "a number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


# ------------------------------------------------------------------------------------------------ layers

def _known_layers(synthetic: bool) -> str:
    from fovi_lab.graph.layers import LAYERS, SYNTHETIC
    names = ", ".join(LAYERS)
    extra = f"; synthetic shapes {', '.join(SYNTHETIC)}" if synthetic else ""
    return (f"known: {names}, their variants <layer>_rf1 / <layer>_rf2, fovi's own network layers "
            f"fovi:<net>@<in_res>[:<i>]{extra}")


def layer_name(text: str) -> str:
    """An argument type: a layer of the layer table (``fovi_lab.graph.layers.LAYERS``), a variant
    ``<layer>_rf1`` / ``<layer>_rf2`` of one, or one layer of a layer source (:func:`add_layer_source`:
    ``fovi:resnet18@64:0``)."""
    if _source_of(text) is not None:
        names = _source_layers(text)
        if names != [text]:
            raise argparse.ArgumentTypeError(f"{text!r} names {len(names)} layers ({names[0]} to {names[-1]}); "
                                             f"give one")
        return text
    return _table_layer(text, False, "")


def _table_layer(text: str, synthetic: bool, more: str) -> str:
    """``text`` where it is a layer or variant of the layer table, else an ``ArgumentTypeError`` naming the known
    layers (:func:`_known_layers` with ``synthetic``) and then ``more``."""
    from fovi_lab.graph.layers import resolve_layer
    try:
        resolve_layer(text)
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown layer {text!r}; {_known_layers(synthetic)}{more}") from None
    return text


def layer_names(synthetic: bool = False) -> Callable[[str], str]:
    """An argument type for one name of a ``--layers`` list: a layer or variant (:func:`layer_name`), the word
    ``all`` (every layer of the table; :class:`LayersAction` expands it), a name of a layer source
    (:func:`add_layer_source`: ``fovi:resnet18@64:0``, ``fovi:alexnet@128``, ``fovi:all``, the layers of fovi's own
    networks; needs fovi) and, with ``synthetic``, the synthetic test shapes of ``fovi_lab.graph.layers.SYNTHETIC``."""
    def parse(text: str) -> str:
        from fovi_lab.graph.layers import SYNTHETIC
        if text == "all" or (synthetic and text in SYNTHETIC):
            return text
        if _source_of(text) is not None:
            _source_layers(text)
            return text
        return _table_layer(text, synthetic, ", or all")
    parse.__name__ = "layer name"
    return parse


#: name prefix -> a function expanding a name of that prefix into layer names (ValueError / ImportError where it
#: cannot): layers that are not in the table, from a source above this layer (:func:`add_layer_source`).
_LAYER_SOURCES: Dict[str, Callable[[str], List[str]]] = {}


def add_layer_source(prefix: str, expand: Callable[[str], List[str]]) -> None:
    """Let ``--layers`` take names starting with ``prefix``: ``expand(name)`` gives the layers a name stands for
    (:mod:`fovi_lab.integrations.fovi` adds ``fovi:``, the layers of fovi's own networks)."""
    _LAYER_SOURCES[prefix] = expand


def _source_of(text: str) -> Optional[Callable[[str], List[str]]]:
    return next((f for prefix, f in _LAYER_SOURCES.items() if text.startswith(prefix)), None)


def _source_layers(text: str) -> List[str]:
    """The layers a name of a layer source stands for (:func:`add_layer_source`), or the argument error saying why
    not (a package it needs missing, a name the source does not have)."""
    try:
        return _source_of(text)(text)
    except ImportError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None


def expand_layers(names: Iterable[str]) -> List[str]:
    """``names`` with ``all`` replaced by every layer of the table and a group of fovi's network layers
    (``fovi:resnet18@64``, ``fovi:all``) by its layers, each name once, in order."""
    from fovi_lab.graph.layers import LAYERS
    out: List[str] = []
    for name in names:
        every = LAYERS if name == "all" else _source_layers(name) if _source_of(name) is not None else (name,)
        for n in every:
            if n not in out:
                out.append(n)
    return out


class LayersAction(argparse.Action):
    """Stores a ``--layers`` list with ``all`` expanded (:func:`expand_layers`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, expand_layers(values))


# ------------------------------------------------------------------------------------------------ backends

def backend_name(allow_auto: bool = False, trains: bool = False) -> Callable[[str], str]:
    """An argument type: a backend of the ops registry (``fovi_lab.ops.registry.OPS_REGISTRY``, the optional Warp
    backends loaded first), ``auto`` when ``allow_auto``; with ``trains``, only a backend that computes gradients."""
    def parse(text: str) -> str:
        from fovi_lab.ops.registry import OPS_REGISTRY, load_optional_backends, trains as backend_trains
        if allow_auto and text == "auto":
            return text
        if text not in OPS_REGISTRY:
            load_optional_backends()
        names = sorted(n for n in OPS_REGISTRY if not trains or backend_trains(OPS_REGISTRY[n]))
        known = ", ".join(names) + (", auto" if allow_auto else "")
        if text not in OPS_REGISTRY:
            which = "registered backends that train" if trains else "registered"
            raise argparse.ArgumentTypeError(f"unknown {text!r}; {which}: {known}")
        if text not in names:
            raise argparse.ArgumentTypeError(f"{text!r} is forward-only; expected a backend that trains: {known}")
        return text
    parse.__name__ = "backend name"
    return parse


# ------------------------------------------------------------------------------------------------ devices

def check_device(device):
    """The torch device ``device`` names, if the package's commands can run there: ``cpu``, or ``cuda[:i]`` with
    that GPU visible to torch. Raises ValueError saying why not (the message starts with ``device:``)."""
    import torch
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: {device!r} is not a torch device ({exc})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected cpu or cuda[:i], got {device!r} (the Warp kernels run on those only)")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} asked for, but torch sees no CUDA device on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device: {device!r} asked for, but torch sees {torch.cuda.device_count()} CUDA "
                             f"device(s)")
    return dev


def device_name(text: str) -> str:
    """An argument type: ``cpu`` or ``cuda[:i]``, usable on this machine (:func:`check_device`)."""
    try:
        check_device(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)[len("device: "):]) from None
    return text


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """The ``--device`` option of every command that computes: ``cpu`` or ``cuda[:i]``, checked as parsed
    (:func:`device_name`); None (the default) lets the command take a GPU when torch sees one."""
    parser.add_argument("--device", type=device_name, default=None,
                        help="cpu or cuda[:i] (default: cuda when torch sees a GPU, else cpu)")


def add_out_option(parser: argparse.ArgumentParser, shown: str) -> None:
    """The ``--out`` option of a benchmark that appends its records only where asked: a JSON-lines file, checked
    as parsed (:func:`out_file`); ``shown`` says what the command prints (``"the table is printed"``)."""
    parser.add_argument("--out", type=out_file, default=None,
                        help=f"JSON-lines file to append the records to (default: none, {shown})")


def device_kind(text: str) -> str:
    """An argument type: ``cpu`` or ``cuda`` (no index: the command places its processes itself), usable here."""
    if text not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu or cuda, got {text!r}")
    return device_name(text)


# ------------------------------------------------------------------------------------------------ paths

def _expanded(text: str) -> Path:
    """``text`` as a path with ``~`` expanded (a shell leaves ``--out=~/x`` as it is); an unknown ``~user`` is
    refused."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected a file in an existing folder, got {text!r} (no such home "
                                         f"folder)") from None


def unwritable(path) -> Optional[str]:
    """Why records cannot be appended to the file ``path``, or None when they can: an existing file is opened for
    appending (its contents and time stamps unchanged), a new one is tried as a temporary file in the nearest
    folder that exists (its folders are made when the first records come). So a read-only folder or file is
    refused before a benchmark runs, not after it has timed everything."""
    import tempfile

    path = Path(path)
    if path.exists():
        try:
            with open(path, "a"):
                pass
        except OSError as exc:
            return f"it cannot be appended to: {exc.strerror or exc}"
        return None
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{str(folder)!r} is not a folder"
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"no file can be made in {str(folder)!r}: {exc.strerror or exc}"
    return None


def out_file(text: str) -> str:
    """An argument type: a file to write (or append to) in a folder that exists, and that can be written
    (:func:`unwritable`); returned with ``~`` expanded."""
    path = _expanded(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file to write, got the folder {text!r}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file in an existing folder, got {text!r} "
                                         f"(there is no folder {str(path.parent)!r})")
    why = unwritable(path)
    if why is not None:
        raise argparse.ArgumentTypeError(f"expected a file this process can write, got {text!r}: {why}")
    return str(path)


def existing_file(text: str) -> str:
    """An argument type: a file that exists; returned with ``~`` expanded."""
    path = _expanded(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"expected an existing file, got {text!r}")
    return str(path)


def existing_folder(text: str) -> str:
    """An argument type: a folder that exists; returned with ``~`` expanded."""
    path = _expanded(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"expected an existing folder, got {text!r}")
    return str(path)

