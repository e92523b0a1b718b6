"""``tblock demo``: the demo page served from 127.0.0.1, or exported as a folder that opens from file://.

The page (tblock/web: index.html, demo.css, demo.js) loads ``runs.js``, which sets
``window.TBLOCK_DEMO``: the toggles and the code panel, and in an export every run. Served,
runs.js holds no runs; the page asks ``/api/run?heads=2&positional=1&temperature=1.00`` for
each setting of its toggles, and tblock computes it (demo_page.page_run). Exported, every
combination of heads and position code over a temperature grid is computed ahead.
"""

from __future__ import annotations

import functools
import json
import sys
import webbrowser
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from ..outfolder import check_folder, write_folder
from . import demo_page

HOST = "127.0.0.1"
DEFAULT_PORT = 8013                                       # lesson 13
ASSETS = {"index.html": "text/html", "demo.css": "text/css", "demo.js": "text/javascript",
          "code.js": "text/javascript"}


def asset(name: str) -> bytes:
    """One of the page's files, from the installed package."""
    return resources.files("tblock.web").joinpath(name).read_bytes()


def runs_script(mode: str, temperatures, runs=None) -> str:
    """runs.js: ``window.TBLOCK_DEMO = {mode, controls, runs}``, a script so file:// can load it."""
    data = dict(mode=mode, controls=demo_page.controls(temperatures), runs=runs)
    return "window.TBLOCK_DEMO = " + json.dumps(data, ensure_ascii=False, separators=(",", ":")) + ";\n"


def parse_run_query(query: str) -> tuple[int, bool, float]:
    """heads, positional and temperature from /api/run's query; ValueError naming what is wrong."""
    fields = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = set(fields) - {"heads", "positional", "temperature"}
    if unknown:
        raise ValueError(f"/api/run takes heads, positional and temperature, got {sorted(unknown)}")
    raw = {**{k: str(v) for k, v in demo_page.DEFAULT.items()}, **fields}
    try:
        heads = int(raw["heads"])
    except ValueError:
        raise ValueError(f"heads must be one of {demo_page.HEADS}, got {raw['heads']!r}") from None
    flags = {"1": True, "true": True, "True": True, "0": False, "false": False, "False": False}
    if raw["positional"] not in flags:
        raise ValueError(f"positional must be 1 or 0, got {raw['positional']!r}")
    try:
        temperature = float(raw["temperature"])
    except ValueError:
        raise ValueError(f"temperature must be a finite number > 0, got {raw['temperature']!r}") from None
    return demo_page.check_settings(heads, flags[raw["positional"]], temperature)


@functools.lru_cache(maxsize=512)
def run_json(heads: int, positional: bool, temperature: float) -> bytes:
    return json.dumps(demo_page.page_run(heads, positional, temperature), ensure_ascii=False).encode()


class DemoHandler(BaseHTTPRequestHandler):
    """GET the page's files, runs.js and /api/run; nothing else."""

    def do_GET(self):
        url = urlsplit(self.path)
        name = url.path.lstrip("/") or "index.html"
        if url.path == "/api/run":
            try:
                body = run_json(*parse_run_query(url.query))
            except (ValueError, TypeError) as e:
                return self._send(HTTPStatus.BAD_REQUEST, "application/json",
                                  json.dumps({"error": str(e)}).encode())
            return self._send(HTTPStatus.OK, "application/json", body)
        if name == "runs.js":
            script = runs_script("server", demo_page.SERVER_TEMPERATURES)
            return self._send(HTTPStatus.OK, "text/javascript", script.encode())
        if name in ASSETS:
            return self._send(HTTPStatus.OK, ASSETS[name], asset(name))
        self._send(HTTPStatus.NOT_FOUND, "text/plain", f"no such page: {url.path}\n".encode())

    def _send(self, status, content_type, body: bytes):
        self.send_response(status)
        self.send_header("Content-Type", f"{content_type}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")       # a re-run shows the current tblock
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass                                                # the URL line is the whole output


def make_server(port: int = DEFAULT_PORT) -> ThreadingHTTPServer:
    """A server on 127.0.0.1:port (0: a free port, read it from .server_port)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in [0, 65535] (0 picks a free one), got {port!r}")
    return ThreadingHTTPServer((HOST, port), DemoHandler)


def serve(port: int = DEFAULT_PORT, open_browser: bool = True, out=sys.stdout) -> int:
    """Serve until Ctrl-C; print the URL first, so a caller with --port 0 can read it."""
    try:
        server = make_server(port)
    except OSError as e:
        raise ValueError(f"cannot listen on {HOST}:{port} ({e.strerror}); pick another with --port, "
                         "or --port 0 for a free one") from None
    url = f"http://{HOST}:{server.server_port}/"
    print(f"tblock demo: serving {url} (Ctrl-C stops)", file=out, flush=True)
    if open_browser:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("tblock demo: stopped", file=out, flush=True)
    finally:
        server.server_close()
    return 0


EXPORTED = (*ASSETS, "runs.js")
RUNS_MARK = b"window.TBLOCK_DEMO = "        # how an export's runs.js begins


def _exported(path: Path) -> bool:
    """Whether ``path`` belongs to an earlier export: its folder's runs.js is an export's."""
    runs = path.parent / "runs.js"
    if not runs.is_file() or runs.is_symlink():
        return False
    with open(runs, "rb") as f:
        return f.read(len(RUNS_MARK)) == RUNS_MARK


def export(out_dir, temperatures=demo_page.EXPORT_TEMPERATURES, force: bool = False) -> Path:
    """The page and every run into ``out_dir`` by tblock.outfolder's rules (an earlier
    export is replaced; a user's file of the same names only with ``force``, and never
    through a symlink); returns the path of its index.html."""
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ValueError(f"--export needs a folder, got the file {str(out_dir)!r}")
    path = check_folder(str(out_dir), "--export", EXPORTED, _exported, force)
    runs = demo_page.all_runs(temperatures)

    def fill(staging: Path) -> list[str]:
        for name in ASSETS:
            (staging / name).write_bytes(asset(name))
        (staging / "runs.js").write_text(runs_script("static", temperatures, runs), encoding="utf-8")
        return list(EXPORTED)
    write_folder(path, str(out_dir), "--export", fill, _exported, force)
    return Path(out_dir) / "index.html"


def main(args, out=sys.stdout) -> int:
    """``tblock demo [--port N] [--no-browser] [--export DIR]``."""
    try:
        if args.export is not None:
            index = export(args.export, force=args.force)
            print(f"tblock demo: wrote {index} (open it in a browser; no server needed)", file=out)
            return 0
        return serve(args.port, open_browser=not args.no_browser, out=out)
    except (ValueError, TypeError) as e:
        print(f"tblock demo: error: {e}", file=sys.stderr)
        return 2
