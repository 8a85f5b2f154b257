"""Reading suite data: local JSONL / JSON / CSV / Parquet files or Hugging Face hub datasets.

Every data suite goes through three steps, all here:

1. **Where is the data?** :func:`resolve_source` takes the user's ``path`` (a file, a folder, or a
   hub dataset name) or, without one, looks in ``$RLVR_DATA_DIR`` and then in ``../shared/data``
   next to the project checkout. It fails with a message naming the hub dataset to use instead.
2. **Read rows.** :func:`read_records` yields :class:`Record` objects that remember where they came
   from (``file.jsonl:17``, ``file.parquet row 17``, ``openai/gsm8k[test] row 17``), so that
   every complaint about the data names the file, the line and the field.
3. **Build problems.** :class:`ProblemBuilder` turns records into problems with a suite's
   ``build(record)`` function; a :class:`DataError` either stops the load (``on_error="raise"``,
   the default) or is skipped and counted (``on_error="skip"``: see ``suite.skipped`` and
   ``suite.errors``).

Nothing here touches the network unless ``path`` names a hub dataset that is not cached.
"""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from rlvr.tasks.base import Problem, ProblemList
from rlvr.verifiers.errors import InvalidValueError, MissingFileError, UserError, invalid_text
from rlvr.verifiers.files import jsonl_lines, open_text

DATA_DIR_ENV = "RLVR_DATA_DIR"
ON_ERROR = ("raise", "skip")
MAX_ERRORS_KEPT = 100  # error messages kept on a suite in skip mode (the count is always exact)

_LOCAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".csv", ".parquet")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class DataError(UserError, ValueError):
    """A row of a data file is unusable. The message names the file, the line and the field."""

    def __init__(self, where: str, field: str | None, message: str):
        self.where, self.field, self.reason = where, field, message
        what = f"field {field!r}: " if field else ""
        super().__init__(f"{where}: {what}{message}")


@dataclass(frozen=True)
class Record:
    """One row of data and where it came from.

    ``index`` counts the rows of the source from 0; ``where`` is a human location such as
    ``data/test.jsonl:17`` (1-based line) or ``train.parquet row 17``. ``error`` is set instead of
    ``data`` when the row could not even be parsed (invalid JSON, not an object).
    """

    source: str
    index: int
    where: str
    data: dict[str, Any] | None
    error: str | None = None

    def get(self, names: str | Sequence[str], *, required: bool = True, kind: type | tuple = str,
            allow_empty: bool = False) -> Any:
        """The value of the first present field among ``names`` (aliases, e.g. ``("question", "problem")``).

        Raises :class:`DataError` naming the field when it is missing (and ``required``), has the
        wrong type, or is an empty string / empty list (unless ``allow_empty``). Integers are
        accepted where ``kind`` is ``str`` and converted (CSV cells and hub columns are loosely typed).
        """
        names = (names,) if isinstance(names, str) else tuple(names)
        assert self.data is not None
        for name in names:
            if name in self.data and self.data[name] is not None:
                value = self.data[name]
                break
        else:
            if not required:
                return None
            alternatives = f" (or {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
            raise DataError(self.where, names[0], f"missing{alternatives}")
        if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = format_number(value)
        if not isinstance(value, kind):
            expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise DataError(self.where, name, f"expected {expected}, got {type(value).__name__} {str(value)[:60]!r}")
        if not allow_empty and isinstance(value, (str, list)) and not (value.strip() if isinstance(value, str) else value):
            raise DataError(self.where, name, "is empty")
        _check_nested_text(self.where, name, value)
        return value


def check_text(where: str, value: Any, field: str) -> str:
    """``value`` if it is text that can be encoded (UTF-8), else a :class:`DataError` naming the
    place (see :func:`~rlvr.verifiers.errors.invalid_text`)."""
    if not isinstance(value, str):
        raise DataError(where, field, f"expected text, got {type(value).__name__}")
    problem = invalid_text(value)
    if problem:
        raise DataError(where, field, f"{problem}; fix or drop that line")
    return value


def _check_nested_text(where: str, field: str, value: Any) -> None:
    if isinstance(value, str):
        check_text(where, value, field)
    elif isinstance(value, dict):
        for item in value.values():
            _check_nested_text(where, field, item)
    elif isinstance(value, list):
        for item in value:
            _check_nested_text(where, field, item)


def format_number(value: int | float) -> str:
    """``27.0`` -> ``"27"``; other numbers as Python writes them (hub/CSV golds are often floats)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# --------------------------------------------------------------------------- where the data is

def data_dir_candidates() -> list[tuple[str, Path]]:
    """Where suites look for their data when given no path: ``$RLVR_DATA_DIR`` when it is set,
    else ``shared/data`` beside the project checkout (this project's development layout)."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return [(f"${DATA_DIR_ENV}", Path(env).expanduser())]
    return [("the checkout's ../shared/data", Path(__file__).resolve().parents[1].parent / "shared" / "data")]


def project_data_dir() -> Path | None:
    """``$RLVR_DATA_DIR`` if set, else ``../shared/data`` beside the project checkout if it exists."""
    label, path = data_dir_candidates()[0]
    return path if label.startswith("$") or path.is_dir() else None


def data_dir_help() -> str:
    """Where the data was looked for, and how to point the suites at it (for messages)."""
    looked = "; ".join(f"{label} = {path} ({'exists' if path.is_dir() else 'absent'})"
                       for label, path in data_dir_candidates())
    unset = "" if os.environ.get(DATA_DIR_ENV) else f"${DATA_DIR_ENV} is unset; "
    return (f"looked in: {unset}{looked}. Set {DATA_DIR_ENV} to a folder holding the benchmark files "
            "(gsm8k/, math/, math500/, humaneval/, mbpp/, countdown/, extra_math/, as in the project's shared/data)")


def looks_like_hub_name(path: str) -> bool:
    """``owner/name`` (or a bare name) that is not a local path and has no data-file suffix."""
    return bool(_HUB_NAME.match(path)) and not path.endswith(_LOCAL_SUFFIXES) and not Path(path).exists()


def resolve_source(suite: str, path: str | os.PathLike | None, candidates: Sequence[str], hub_hint: str) -> str:
    """The file (or hub dataset name) a suite reads.

    Args:
        suite: the suite's name, for messages.
        path: what the user passed: a file (used as is), a folder (searched for ``candidates``),
            a hub dataset name (returned as is), or None (the project data folder is searched).
        candidates: relative file names to look for in a folder, in order of preference, e.g.
            ``("gsm8k/test.jsonl", "test.jsonl")``.
        hub_hint: the hub dataset users can pass instead, named in the error message.
    """
    if path is not None:
        text = str(path)
        local = Path(text).expanduser()
        if local.is_file():
            return str(local)
        if local.is_dir():
            for rel in candidates:
                if (local / rel).is_file():
                    return str(local / rel)
            raise MissingFileError(f"{suite}: none of {', '.join(candidates)} found in folder {local}")
        if looks_like_hub_name(text):
            return text
        raise MissingFileError(f"{suite}: {text} is neither a file, a folder nor a Hugging Face dataset name")
    root = project_data_dir()
    if root is not None:
        for rel in candidates:
            if (root / rel).is_file():
                return str(root / rel)
    raise MissingFileError(
        f"{suite}: no local data ({' or '.join(candidates)}); {data_dir_help()}; or pass path= a local copy, or the "
        f"Hugging Face dataset {hub_hint!r} (read through `datasets`)."
    )


# --------------------------------------------------------------------------- reading rows

def read_records(source: str, *, hub_split: str = "train", hub_config: str | None = None) -> Iterator[Record]:
    """The rows of a local file or a hub dataset, as :class:`Record` objects (see the module docstring).

    Local formats by suffix: ``.jsonl`` / ``.jsonl.gz`` (one object per line, blank lines
    skipped), ``.json`` (a list of objects, or ``{"data": [...]}``), ``.csv`` (header row),
    ``.parquet``. Anything else that is not a local file is loaded with
    ``datasets.load_dataset(source, hub_config, split=hub_split)``.
    """
    if Path(source).is_file():
        lower = source.lower()
        if lower.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
            yield from _read_jsonl(source)
        elif lower.endswith((".json", ".json.gz")):
            yield from _read_json(source)
        elif lower.endswith(".csv"):
            yield from _read_csv(source)
        elif lower.endswith(".parquet"):
            yield from _read_rows(source, _parquet_rows(source), "row")
        else:
            raise InvalidValueError(f"{source}: unknown data format; use .jsonl, .jsonl.gz, .json, .csv or .parquet")
        return
    yield from _read_rows(f"{source}[{hub_split}]", _hub_rows(source, hub_split, hub_config), "row")


def _read_jsonl(path: str) -> Iterator[Record]:
    for index, (where, data, problem) in enumerate(jsonl_lines(path)):
        yield Record(path, index, where, data, problem)


def _read_json(path: str) -> Iterator[Record]:
    with open_text(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}", None, f"invalid JSON ({exc.msg})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(path, None, "a .json data file must hold a list of objects (or {'data': [...]})")
    yield from _read_rows(path, iter(data), "item")


def _read_csv(path: str) -> Iterator[Record]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        index, start = 0, 2  # line 1 is the header
        for row in reader:
            # a quoted cell may span lines: the row starts where the previous one ended
            yield _checked(path, index, f"{path}:{start}", {k: v for k, v in row.items() if k is not None})
            index, start = index + 1, reader.line_num + 1


def _parquet_rows(path: str) -> Iterator[dict]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        yield from batch.to_pylist()


HUB_PROBE_TIMEOUT_S = 3.0


def _hub_rows(name: str, split: str, config: str | None) -> Iterator[dict]:
    """The rows of the hub dataset ``name``, or one line saying why it cannot be had and what to use instead.

    Offline, ``datasets`` retries the hub five times (about 25 s) and then raises a ``ConnectionError``
    traceback; so the hub is probed first (a TCP connection, at most :data:`HUB_PROBE_TIMEOUT_S`), and a
    hub that cannot be reached is reported at once. ``HF_HUB_OFFLINE=1`` (or ``HF_DATASETS_OFFLINE=1``)
    skips the probe and reads the ``datasets`` cache only.
    """
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a core dependency
        raise ImportError("loading a Hugging Face dataset needs the `datasets` package") from exc
    local = ("pass path= a local copy instead (.jsonl, .json, .csv or .parquet; e.g. written on a machine with "
             "network by datasets' load_dataset(...).to_json(FILE))")
    offline = bool(datasets.config.HF_HUB_OFFLINE)
    if not offline:
        endpoint = _hub_endpoint()
        problem = _unreachable(endpoint)
        if problem:
            raise MissingFileError(f"{name}: cannot fetch this Hugging Face dataset: the hub ({endpoint}) cannot be "
                                   f"reached ({problem}); {local}, or set HF_HUB_OFFLINE=1 to read a copy already "
                                   "in the datasets cache")
    try:
        dataset = datasets.load_dataset(name, config, split=split)
    except (ConnectionError, FileNotFoundError, ValueError) as exc:  # DatasetNotFoundError is a FileNotFoundError
        reason = " ".join(str(exc).split())[:300]
        if offline:
            raise MissingFileError(f"{name}: this Hugging Face dataset is not in the datasets cache, and HF_HUB_OFFLINE "
                                   f"(or HF_DATASETS_OFFLINE) keeps it from being fetched ({reason}); {local}, or "
                                   "unset it on a machine with network") from exc
        raise MissingFileError(f"{name}: cannot load this Hugging Face dataset (split {split!r}"
                               f"{f', config {config!r}' if config else ''}): {reason}; check the name, split and "
                               f"config, or {local}") from exc
    yield from dataset


def _hub_endpoint() -> str:
    """The hub ``datasets`` talks to (``HF_ENDPOINT``), read when asked: huggingface_hub holds it."""
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except ImportError:  # pragma: no cover - a dependency of datasets
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def _unreachable(endpoint: str) -> str | None:
    """Why a TCP connection to ``endpoint`` cannot be opened (None: it can). Behind an HTTP(S) proxy the
    proxy decides, so no probe is made."""
    import socket
    from urllib.parse import urlsplit

    if any(os.environ.get(var) for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return None
    url = urlsplit(endpoint)
    if not url.hostname:
        return f"not a URL: {endpoint!r}"
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                      timeout=HUB_PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return str(exc) or type(exc).__name__


def _read_rows(source: str, rows: Iterable[Any], unit: str) -> Iterator[Record]:
    for index, data in enumerate(rows):
        yield _checked(source, index, f"{source} {unit} {index + 1}", data)


def _checked(source: str, index: int, where: str, data: Any) -> Record:
    if not isinstance(data, dict):
        return Record(source, index, where, None, f"expected an object, got {type(data).__name__}")
    return Record(source, index, where, data)


# --------------------------------------------------------------------------- building problems

class ProblemBuilder:
    """Records -> problems, with the suite's error policy.

    ``on_error="raise"`` re-raises the first :class:`DataError`; ``"skip"`` drops the row, counts
    it in ``skipped`` and keeps the message (the first :data:`MAX_ERRORS_KEPT`) in ``errors``.
    ``build`` returns a :class:`Problem`, or None for a row the suite leaves out on purpose
    (another split's row): those are not errors.
    """

    def __init__(self, suite: str, on_error: str = "raise"):
        if on_error not in ON_ERROR:
            raise InvalidValueError(f"{suite}: on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        self.suite, self.on_error = suite, on_error
        self.skipped = 0
        self.errors: list[str] = []

    def build(self, records: Iterable[Record], build: Callable[[Record], Problem | None]) -> list[Problem]:
        problems: list[Problem] = []
        seen: dict[str, str] = {}
        for record in records:
            try:
                if record.error is not None:
                    raise DataError(record.where, None, record.error)
                problem = build(record)
                if problem is None:
                    continue
                if problem.id in seen:
                    raise DataError(record.where, None, f"duplicate problem id {problem.id!r} (first at {seen[problem.id]})")
                seen[problem.id] = record.where
                problems.append(problem)
            except DataError as exc:
                if self.on_error == "raise":
                    raise
                self.skipped += 1
                if len(self.errors) < MAX_ERRORS_KEPT:
                    self.errors.append(str(exc))
        return problems


class LoadedSuite(ProblemList):
    """A suite whose problems are built once, up front: ``len``, iteration, indexing, and the
    bad-data counters ``skipped`` / ``errors`` (see :class:`ProblemBuilder`)."""

    name: str = ""
    default_verifier: str = ""
    splits: tuple[str, ...] = ()

    _problems: list[Problem]
    skipped: int = 0
    errors: list[str] = []

    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            raise InvalidValueError(f"{self.name}: unknown split {split!r}; valid splits: {', '.join(self.splits)}")

    def _load(self, records: Iterable[Record], build: Callable[[Record], Problem | None], on_error: str) -> None:
        builder = ProblemBuilder(self.name, on_error)
        self._problems = builder.build(records, build)
        self.skipped, self.errors = builder.skipped, builder.errors


    def __repr__(self) -> str:
        skipped = f", skipped={self.skipped}" if self.skipped else ""
        return f"<{type(self).__name__} {self.name} split={getattr(self, 'split', '?')} n={len(self)}{skipped}>"


def instruction_text(value: str | None, default: str = "") -> str:
    """A suite's ``instruction`` option: None -> the suite's ``default``; ``"none"`` (as a YAML config
    writes it) or ``""`` -> no instruction; anything else -> that text."""
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidValueError(f"instruction must be text, 'none' or null (the suite's default), got {value!r}")
    return "" if value.strip().lower() == "none" else value


def fenced(code: str) -> str:
    """Code in a fenced Python block (the form the ``code`` verifier extracts)."""
    return f"```python\n{code.rstrip()}\n```"
