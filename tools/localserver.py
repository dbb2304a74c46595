"""A quiet HTTP server for a built site on 127.0.0.1, used by the PDF, screenshot and browser-test tools."""

from __future__ import annotations

import contextlib
import functools
import http.server
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

#: Flags for Debian's chromium on a machine without a network or a display.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # a browser closing early is not an error
        pass


@contextlib.contextmanager
def serve(directory: str | Path) -> Iterator[str]:
    """Serve ``directory`` on 127.0.0.1 (a free port) in a background thread; yield its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def chromium_executable() -> str:
    """Path of Debian's chromium; raises SystemExit with the fix when it is missing."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise SystemExit("Debian's chromium is required: apt-get install chromium (make site-test does this)")
    return path
