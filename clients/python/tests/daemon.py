"""Runs a real ``inboxd serve`` for the tests: a temp data dir, a free
loopback port, a client and an admin token file, stopped with SIGTERM."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[3]
TOKEN_TEXT = "py-test-token\n"  # the newline is not part of the token
ADMIN_TOKEN_TEXT = "py-test-admin-token\n"


def inboxd_binary() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("INBOXD_BIN", REPO / "target" / "debug" / "inboxd"))
    if not path.exists():
        raise RuntimeError(f"{path} not found: run clients/python/run-tests.sh, which builds it")
    return path


class Daemon:
    def __init__(self, *extra: str) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="inboxd-py-")
        data = pathlib.Path(self._dir.name) / "data"
        self.token_file = pathlib.Path(self._dir.name) / "token"
        self.token_file.write_text(TOKEN_TEXT)
        # inboxd refuses a token file that group or others can read.
        self.token_file.chmod(0o600)
        self.admin_token_file = pathlib.Path(self._dir.name) / "admin_token"
        self.admin_token_file.write_text(ADMIN_TOKEN_TEXT)
        self.admin_token_file.chmod(0o600)
        self._proc = subprocess.Popen(
            [
                str(inboxd_binary()),
                "serve",
                "--data-dir",
                str(data),
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                "--token-file",
                str(self.token_file),
                "--admin-token-file",
                str(self.admin_token_file),
                *extra,
            ],
            stdout=subprocess.PIPE,
            env={**os.environ, "INBOXD_LOG": "warn"},
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        # "listening on ADDR metrics on ADDR"
        words = line.split()
        if len(words) != 6 or words[:2] != ["listening", "on"]:
            self.stop()
            raise RuntimeError(f"inboxd did not start: {line!r}")
        host, port = words[2].rsplit(":", 1)
        self.host, self.port = host, int(port)

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._dir.cleanup()

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
