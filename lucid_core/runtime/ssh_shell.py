"""One shell kept open on a host over an SSH channel, running each call's script in a fresh `sh`.

sshd starts every command through the account's login shell, and bash run by sshd reads `~/.bashrc`
even for `bash -c`: on hosts whose rc files set up conda, pyenv or modules that is 100-300 ms of the
host's CPU per call, more than the scripts themselves. A kept shell pays it once per connection; each
script then runs as `sh -s` fed by a here-document, in a child process, so nothing a script does
(`exit`, `cd`, variables) reaches the kept shell. Each call's reply is framed by a random token:

    <stdout of the script>\\n<token> <exit status>\\n<stderr, at most 64 KB>\\n<token>.\\n

The token is drawn per call and never written anywhere on the host but the kept shell's stdin, so a
job's output (a file the script prints) cannot end a reply early or forge its status.
"""

from __future__ import annotations

import re
import secrets
import time

import paramiko

from lucid_core.runtime.executor import ScriptResult

STDERR_KEPT = 65536  # bytes of a script's stderr brought back (diagnostics only)
READ_CHUNK = 1 << 16


class ShellClosed(EOFError):
    """The kept shell ended or its channel closed while a call was waiting for its reply."""


class KeptShell:
    """A `sh` reading commands from one session channel; `run()` makes one call at a time."""

    def __init__(self, client: paramiko.SSHClient, timeout_s: float) -> None:
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise ShellClosed("the connection is closed")
        self.channel = transport.open_session(timeout=timeout_s)
        self.channel.exec_command("exec sh")

    @property
    def alive(self) -> bool:
        return not (self.channel.closed or self.channel.exit_status_ready())

    def run(self, script: str, deadline: float) -> ScriptResult:
        """Run `script` in a fresh `sh -s`; TimeoutError past `deadline` (the shell is then closed)."""
        token = f"LUCID_{secrets.token_hex(16)}"
        if token in script:  # a 128-bit draw; checked so a collision cannot cut the script short
            token = f"LUCID_{secrets.token_hex(16)}"
        body = script if script.endswith("\n") else script + "\n"
        command = (f"e=$(mktemp 2>/dev/null) || e=/dev/null\n"
                   f"sh -s 2>\"$e\" <<'{token}'\n{body}{token}\n"
                   f"s=$?; printf '\\n%s %d\\n' {token} \"$s\"\n"
                   f"[ \"$e\" = /dev/null ] || {{ head -c {STDERR_KEPT} \"$e\"; rm -f \"$e\"; }}\n"
                   f"printf '\\n%s.\\n' {token}\n")
        try:
            while self.channel.recv_stderr_ready():  # the kept shell's own stderr (nothing expected): drop it
                self.channel.recv_stderr(READ_CHUNK)
            self._send(command.encode(), deadline)
            reply = self._read_reply(token.encode(), deadline)
        except BaseException:
            self.close()
            raise
        return reply

    def _send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            self.channel.settimeout(_left(deadline))
            sent = self.channel.send(view)
            if sent <= 0:
                raise ShellClosed("the kept shell's channel closed while sending")
            view = view[sent:]

    def _read_reply(self, token: bytes, deadline: float) -> ScriptResult:
        status_line = re.compile(b"\n" + token + b" (-?[0-9]+)\n")
        end = b"\n" + token + b".\n"
        buffer = bytearray()
        while True:
            found = status_line.search(buffer)
            if found is not None and buffer.endswith(end, found.end()):
                out = bytes(buffer[: found.start()])
                err = bytes(buffer[found.end(): len(buffer) - len(end)])
                return ScriptResult(int(found.group(1)), out.decode("utf-8", "replace"),
                                    err.decode("utf-8", "replace"))
            self.channel.settimeout(_left(deadline))
            chunk = self.channel.recv(READ_CHUNK)
            if not chunk:
                raise ShellClosed("the kept shell ended before the call's reply was complete")
            buffer += chunk

    def close(self) -> None:
        self.channel.close()


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the call's deadline passed")
    return left
