"""One shell kept open on a host over an SSH channel, running each call's script in a fresh `sh`.

sshd starts every command through the account's login shell, and bash run by sshd reads `~/.bashrc`
even for `bash -c`: on hosts whose rc files set up conda, pyenv or modules that is 100-300 ms of the
host's CPU per call, more than the scripts themselves. A kept shell pays it once per connection; each
script then runs as `sh -s` fed by the shell's builtin `printf` through a pipe (no here-document, which
some shells write to /tmp: a job that fills the disk must not make the host unreachable), in a child
process, so nothing a script does (`exit`, `cd`, variables) reaches the kept shell. Each call's reply
is framed by a random token:

    <token>:\\n<stdout of the script>\\n<token> <exit status>\\n<stderr, at most 64 KB>\\n<token>.\\n

The token is drawn per call and never written anywhere on the host, so a job's output (a file the
script prints) cannot end a reply early or forge its status, and bytes that reach the kept shell's
stdout between calls (an rc file's greeting) fall before the opening line and are dropped.
"""

from __future__ import annotations

import re
import secrets
import shlex
import time
from collections.abc import Callable

import paramiko

from lucid_core.runtime.hosts.executor import ScriptResult

STDERR_KEPT = 65536  # bytes of a script's stderr brought back (diagnostics only)
READ_CHUNK = 1 << 16
_STATUS_ROOM = 64  # bytes a status line may span: a match can start this far before a new chunk


#: A kept shell silent for longer than this is asked to answer before a script is sent on it: a host that died
#: (powered off, hung) keeps its TCP connection looking open, and a script sent into it may or may not have run.
CONFIRM_AFTER_S = 5.0


class ShellClosed(EOFError):
    """The kept shell ended or its channel closed while a call was waiting for its reply."""


class ShellSilent(TimeoutError):
    """A kept shell that had been idle did not answer before the call's deadline; its script was not sent."""


class KeptShell:
    """A `sh` reading commands from one session channel of `client`; `run()` makes one call at a time."""

    def __init__(self, client: paramiko.SSHClient, timeout_s: float) -> None:
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise ShellClosed("the connection is closed")
        self.transport = transport
        self.channel = transport.open_session(timeout=timeout_s)
        self.channel.exec_command("exec sh")
        self.heard_at = time.monotonic()  # the host confirmed the channel just now

    def serves(self, client: paramiko.SSHClient) -> bool:
        """Still open, on this client's connection."""
        return (client.get_transport() is self.transport and not self.channel.closed
                and not self.channel.exit_status_ready())

    def run(self, script: str, deadline: float, on_send: Callable[[], None] = lambda: None) -> ScriptResult:
        """Run `script` in a fresh `sh -s`; TimeoutError past `deadline` (the shell is then closed). `on_send` is
        called just before the script leaves: until then nothing of it can run on the host (`ShellSilent`)."""
        token = f"LUCID_{secrets.token_hex(16)}"
        # stderr goes to a file unlinked as soon as it is open (nothing is left behind when a call is cut
        # off); a redirection that fails skips the group, and the reply then says so with status 125
        command = (f"printf '%s:\\n' {token}\n"
                   "ran=; e=$(mktemp 2>/dev/null) || e=/dev/null\n"
                   "{ ran=1; [ \"$e\" = /dev/null ] || rm -f \"$e\"\n"
                   f"printf '%s' {shlex.quote(script)} | sh -s 2>&3 3>&- 4<&-\n"
                   f"s=$?; printf '\\n%s %d\\n' {token} \"$s\"; head -c {STDERR_KEPT} <&4; }} 3>\"$e\" 4<\"$e\"\n"
                   f"[ -n \"$ran\" ] || {{ [ \"$e\" = /dev/null ] || rm -f \"$e\"; "
                   f"printf '\\n%s 125\\ncannot open a file for the script'\"'\"'s stderr' {token}; }}\n"
                   f"printf '\\n%s.\\n' {token}\n").encode("utf-8", "surrogateescape")
        try:
            if time.monotonic() - self.heard_at > CONFIRM_AFTER_S:
                self._confirm(deadline)
            on_send()
            self._send(command, deadline)
            reply = self._read_reply(token.encode(), deadline)
        except BaseException:
            self.close()
            raise
        self.heard_at = time.monotonic()
        return reply

    def _confirm(self, deadline: float) -> None:
        """A harmless echo that must come back before the script is sent; `ShellSilent` when it does not."""
        token = f"LUCID_{secrets.token_hex(16)}".encode()
        line = token + b"\n"
        self._send(b"printf '%s\\n' " + token + b"\n", deadline)
        tail = b""
        while line not in tail:
            self._drain_own_stderr()
            try:
                self.channel.settimeout(_left(deadline))
                chunk = self.channel.recv(READ_CHUNK)
            except TimeoutError as exc:  # socket.timeout too
                raise ShellSilent("the kept shell did not answer before the call's deadline") from exc
            if not chunk:
                raise ShellClosed("the kept shell ended before it confirmed it was alive")
            tail = (tail + chunk)[-(len(line) + READ_CHUNK):]

    def _send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            self.channel.settimeout(_left(deadline))
            sent = self.channel.send(view)
            if sent <= 0:
                raise ShellClosed("the kept shell's channel closed while sending")
            view = view[sent:]

    def _read_reply(self, token: bytes, deadline: float) -> ScriptResult:
        """Read until the end line; each marker is searched for only in what arrived since (plus a margin)."""
        opening, status_line, end = token + b":\n", re.compile(b"\n" + token + b" (-?[0-9]+)\n"), b"\n" + token + b".\n"
        buffer = bytearray()
        begin = status = stop = None  # offsets: after the opening line; the status match; the end line
        scanned = 0
        while stop is None:
            self._drain_own_stderr()
            self.channel.settimeout(_left(deadline))
            chunk = self.channel.recv(READ_CHUNK)
            if not chunk:
                raise ShellClosed("the kept shell ended before the call's reply was complete")
            buffer += chunk
            if begin is None:
                at = buffer.find(opening, max(0, scanned - len(opening)))
                if at >= 0:
                    begin = at + len(opening)
            if begin is not None and status is None:
                status = status_line.search(buffer, max(begin, scanned - _STATUS_ROOM))
            if status is not None:
                at = buffer.find(end, max(status.end(), scanned - len(end)))
                stop = at if at >= 0 else None
            scanned = len(buffer)
        out = bytes(buffer[begin: status.start()])
        err = bytes(buffer[status.end(): stop])
        return ScriptResult(int(status.group(1)), out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                            out)

    def _drain_own_stderr(self) -> None:
        """The kept shell's own stderr (nothing is expected there): read and dropped, so it holds no window."""
        while self.channel.recv_stderr_ready():
            self.channel.recv_stderr(READ_CHUNK)

    def close(self) -> None:
        self.channel.close()


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the call's deadline passed")
    return left
