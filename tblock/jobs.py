"""The batch job's files: the requests read from a JSONL input, the records written to a
JSONL output that survives interruption (``tblock generate MODEL --input IN --output OUT``).

    requests = read_requests("prompts.jsonl", model, tokenizer, defaults, on_error="skip")
    with JobOutput("out.jsonl", settings) as out:           # resumes a job of these settings
        todo = [r for r in requests if r.id not in out.done_ids()]
        out.write(record_of(request, tokens, tokenizer))    # one fsync'd line per prompt

An input line is ``{"id": ID, "ids": [...]}`` or ``{"id": ID, "prompt": "..."}`` with
optional PARAMS (null keeps the command line's value).  Every line is checked before any
generation; a bad one is reported with its line number.  The output is the JSONL file plus
a sidecar OUT.job holding the settings (the input's path and sha256, the model, the
defaults, the base seed): a rerun with the same settings appends what is missing, a file
that is not such a job's output is never overwritten without ``force``.  docs/batch.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .config import check_int
from .models.sampling import check_filters, check_temperature, check_token_id

# the per-line parameters and the keyword of generate_many each one goes to
PARAMS = {"max_new_tokens": "max_new_tokens", "temperature": "temperature", "top_k": "top_k",
          "top_p": "top_p", "seed": "seed", "eos": "eos_token_id"}
ON_ERROR = ("skip", "fail")
SIDECAR_KEY = "tblock_generate_job"     # marks a sidecar as ours
SEED_BITS = 63


@dataclass(frozen=True)
class Request:
    """One good input line: its 1-based line number, its id (a str or an int), the prompt's
    token ids and its parameters, every one of PARAMS resolved (seed derived where needed)."""
    line: int
    id: str | int
    ids: list[int]
    params: dict = field(default_factory=dict)

    def generate_kwargs(self) -> dict:
        """params under generate's names (eos -> eos_token_id)."""
        return {PARAMS[k]: v for k, v in self.params.items()}


def derived_seed(base: int, id_) -> int:
    """The seed of a sampled line that gives none: a hash of the base seed and the id, so a
    resumed or reordered run draws the same tokens for each line."""
    key = json.dumps([base, id_], ensure_ascii=False).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> (64 - SEED_BITS)


def check_param(name: str, value, vocab_size: int):
    """One parameter's value checked (None allowed for top_k, top_p, seed, eos):
    ValueError/TypeError naming it otherwise."""
    if name == "max_new_tokens":
        return check_int(name, value, 0)
    if name == "temperature":
        return check_temperature(value)
    if value is None:
        return None
    if name == "top_k":
        return check_filters(value, None)[0]
    if name == "top_p":
        return check_filters(None, value)[1]
    if name == "seed":
        return check_int(name, value, 0)
    if name == "eos":
        return check_token_id(name, value, vocab_size)
    raise ValueError(f"unknown parameter {name!r}: expected one of {', '.join(PARAMS)}")


def check_defaults(defaults: dict, vocab_size: int) -> dict:
    """The command line's values: every one of PARAMS, checked; seed is the base seed
    (required, an int >= 0: the lines that sample without a seed derive theirs from it)."""
    missing = set(PARAMS) - set(defaults)
    extra = set(defaults) - set(PARAMS)
    if missing or extra:
        raise ValueError(f"defaults must hold exactly {sorted(PARAMS)}: missing {sorted(missing)}, "
                         f"unknown {sorted(extra)}")
    out = {k: check_param(k, defaults[k], vocab_size) for k in PARAMS}
    if out["seed"] is None:
        raise ValueError("defaults['seed'] must be the base seed (an int >= 0), got None")
    return out


class BadLine(ValueError):
    """An input line that cannot be a request: its line number and the reason."""

    def __init__(self, line: int, reason: str):
        super().__init__(f"line {line}: {reason}")
        self.line, self.reason = line, reason


def _check_id(value, seen: set):
    # bool is an int subclass; true is not an id
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f'"id" must be a string or an integer, got {_json_type(value)}')
    if value in seen:
        raise ValueError(f'duplicate id {json.dumps(value, ensure_ascii=False)}')
    return value


def _json_type(value) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "an array", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _prompt_ids(obj: dict, model, tokenizer) -> list[int]:
    """The line's prompt as token ids in [0, vocab_size), at least one."""
    has_ids, has_text = "ids" in obj, "prompt" in obj
    if has_ids == has_text:
        raise ValueError('a line needs exactly one of "ids" and "prompt", got '
                         + ("both" if has_ids else "neither"))
    if has_text:
        text = obj["prompt"]
        if not isinstance(text, str):
            raise ValueError(f'"prompt" must be a string, got {_json_type(text)}')
        if tokenizer is None:
            raise ValueError('"prompt" needs tokenizer.json beside the model (and the tokenizers '
                             'package); give "ids" instead')
        ids = list(tokenizer.encode(text).ids)
        if not ids:
            raise ValueError(f'"prompt" {text!r} encodes to no tokens')
        return ids
    ids = obj["ids"]
    if not isinstance(ids, list) or not ids:
        raise ValueError(f'"ids" must be a non-empty array of token ids, got {_json_type(ids)}'
                         + (" (empty)" if ids == [] else ""))
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int):
            raise ValueError(f'"ids"[{i}] must be an integer token id, got {_json_type(t)} {t!r}')
        if not 0 <= t < model.vocab_size:
            raise ValueError(f'"ids"[{i}] = {t} is not a token id in [0, vocab_size={model.vocab_size})')
    return ids


def parse_line(number: int, raw: bytes, model, tokenizer, defaults: dict, seen: set) -> Request:
    """One non-blank input line as a Request; BadLine with the reason otherwise."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BadLine(number, f"not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise BadLine(number, f"not JSON ({e.msg} at column {e.colno})") from None
    try:
        if not isinstance(obj, dict):
            raise ValueError(f"a line must be a JSON object, got {_json_type(obj)}")
        unknown = sorted(set(obj) - {"id", "ids", "prompt", *PARAMS})
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}: a line holds id, ids or prompt, and "
                             f"{', '.join(PARAMS)}")
        if "id" not in obj:
            raise ValueError('no "id"')
        id_ = _check_id(obj["id"], seen)
        ids = _prompt_ids(obj, model, tokenizer)
        params = {}
        for name in PARAMS:
            value = obj.get(name)
            params[name] = defaults[name] if value is None else check_param(name, value, model.vocab_size)
    except (ValueError, TypeError) as e:
        raise BadLine(number, str(e)) from None
    if params["temperature"] == 0.0:
        params["seed"] = None                   # greedy draws nothing
    elif obj.get("seed") is None:
        params["seed"] = derived_seed(defaults["seed"], id_)
    if len(ids) + params["max_new_tokens"] > model.n_positions:
        raise BadLine(number, f"too long: {len(ids)} prompt tokens + max_new_tokens {params['max_new_tokens']} "
                              f"pass the model's n_positions={model.n_positions}")
    seen.add(id_)
    return Request(number, id_, ids, params)


def check_lines(path, model, tokenizer, defaults: dict) -> tuple[list[Request], list[BadLine]]:
    """Every line of the JSONL file ``path``: (the good ones as Requests in input order, the
    bad ones).  Blank lines are skipped; a duplicate id is bad from its second line on."""
    defaults = check_defaults(defaults, model.vocab_size)
    good, bad, seen = [], [], set()
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                good.append(parse_line(number, raw, model, tokenizer, defaults, seen))
            except BadLine as e:
                bad.append(e)
    return good, bad


def read_requests(path, model, tokenizer, defaults: dict, on_error: str = "skip", log=None) -> list[Request]:
    """The good lines of ``path`` as Requests.  ``model`` gives vocab_size and n_positions;
    ``tokenizer`` (a tokenizers.Tokenizer or None) encodes "prompt" lines; ``defaults``
    holds every one of PARAMS (seed: the base seed).  on_error "skip": each bad line is
    reported through ``log`` (a callable taking one line; default stderr) and left out;
    "fail": a ValueError naming the first bad line and how many there are, before anything
    is generated."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    good, bad = check_lines(path, model, tokenizer, defaults)
    if bad and on_error == "fail":
        more = f" (and {len(bad) - 1} more bad lines)" if len(bad) > 1 else ""
        raise ValueError(f"{path} {bad[0]}{more}; nothing generated (--on-error skip leaves bad lines out)")
    if log is None:
        import sys

        def log(message):
            print(message, file=sys.stderr)
    for e in bad:
        log(f"{path} {e}: skipped")
    return good


def record_of(request: Request, tokens, tokenizer=None) -> dict:
    """The output record of a request given its prompt + new tokens: id, ids (prompt and new),
    new_ids, stop ("eos" when the line's eos ended it, else "length") and, with a tokenizer,
    text (the new tokens decoded)."""
    tokens = [int(t) for t in tokens]
    new = tokens[len(request.ids):]
    eos = request.params.get("eos")
    rec = {"id": request.id, "ids": tokens, "new_ids": new,
           "stop": "eos" if eos is not None and new and new[-1] == eos else "length"}
    if tokenizer is not None:
        rec["text"] = tokenizer.decode(new)
    return rec


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class JobOutput:
    """The output file OUT of a job and its sidecar OUT.job (the settings, as JSON).

    Opening it (the constructor) checks and resumes:
      - OUT absent: the sidecar is written, then OUT created empty;
      - OUT present with a sidecar of equal settings: a torn last line (a kill in the middle
        of a write) is cut off, the complete records' ids become ``done_ids()``, new records
        are appended;
      - OUT present without our sidecar, or with other settings: ValueError naming the file,
        unless ``force`` (then both are replaced).
    ``write(record)`` appends one line in one write call, flushed and fsync'd: a record is
    either whole in the file or (torn) cut off on the next open."""

    def __init__(self, path, settings: dict, force: bool = False):
        self.path = Path(path)
        self.sidecar = self.path.with_name(self.path.name + ".job")
        self.settings = json.loads(json.dumps(settings))     # as the sidecar will read back
        self._done: set = set()
        if force or not self.path.exists():
            self._start(force)
        else:
            self._resume()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @staticmethod
    def previous_settings(path) -> dict | None:
        """The settings in OUT.job when OUT exists and the sidecar is ours, else None (how a
        rerun without --seed finds the first run's base seed)."""
        path = Path(path)
        return _read_sidecar(path.with_name(path.name + ".job")) if path.is_file() else None

    def _start(self, force: bool) -> None:
        if not force and self.sidecar.exists() and _read_sidecar(self.sidecar) is None:
            raise ValueError(f"{self.sidecar} exists and is not a tblock generate job's file: pass --force "
                             f"to replace it or choose another --output")
        tmp = self.sidecar.with_name(self.sidecar.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({SIDECAR_KEY: self.settings}, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.sidecar)
        # the sidecar before the output: an output file never exists without its settings
        with open(self.path, "wb") as f:
            os.fsync(f.fileno())
        _fsync_dir(self.path.parent)

    def _resume(self) -> None:
        before = _read_sidecar(self.sidecar)
        if before is None:
            raise ValueError(f"{self.path} exists and is not the output of a tblock generate job (no readable "
                             f"{self.sidecar.name} beside it): pass --force to replace it or choose another --output")
        differ = sorted(k for k in set(before) | set(self.settings) if before.get(k) != self.settings.get(k))
        if differ:
            raise ValueError(f"{self.path} holds a job's output for other settings ({', '.join(differ)} differ, "
                             f"see {self.sidecar.name}): rerun with the same ones to resume, pass --force to "
                             f"replace it, or choose another --output")
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1             # after the last complete line
        if end < len(data):
            os.truncate(self.path, end)         # a torn line: its record is generated again
        for number, raw in enumerate(data[:end].splitlines(), start=1):
            try:
                rec = json.loads(raw.decode("utf-8"))
                id_ = rec["id"]
                hash(id_)
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{self.path} line {number} is not a job record: pass --force to replace "
                                 f"the file or choose another --output") from None
            self._done.add(id_)

    def done_ids(self) -> set:
        """The ids of the complete records in the file (found on opening, and written since)."""
        return set(self._done)

    def write(self, record: dict) -> None:
        """Append ``record`` (a dict with "id") as one JSON line; on disk when this returns."""
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        if record["id"] in self._done:
            raise ValueError(f"{self.path} already holds id {record['id']!r}")
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:                             # a regular file takes it in one call; loop for safety
            view = view[os.write(self._fd, view):]
        os.fsync(self._fd)
        self._done.add(record["id"])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _read_sidecar(sidecar: Path) -> dict | None:
    """The settings a sidecar holds; None when it is absent, unreadable or not ours."""
    try:
        data = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    settings = data.get(SIDECAR_KEY) if isinstance(data, dict) else None
    return settings if isinstance(settings, dict) else None


def _fsync_dir(folder: Path) -> None:
    """The folder's entries (a new file's name) on disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
