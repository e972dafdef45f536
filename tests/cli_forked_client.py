"""`python -I -S cli_forked_client.py SOCKET ARGS...`: `python -m loopdsl ARGS`, forked by the
server at SOCKET (cli_forked_server.py) instead of started afresh.

Standard library only and no `site`, so this process starts in milliseconds. It hands the
server its own stdin, stdout and stderr, directory, environment and umask; the command runs
in a child of the server with exactly those, and this process exits as that child did (with
its exit code, or killed by the same signal). SIGINT, SIGTERM and SIGHUP sent here are passed
on to the command; if this process is killed outright, the server kills the command.
"""
import json
import os
import signal
import socket
import struct
import sys

_HEADER = struct.Struct("!I")
_NUMBER = struct.Struct("!i")


def main() -> None:
    path, args = sys.argv[1], sys.argv[2:]
    request = json.dumps({"args": args, "cwd": os.getcwd(), "env": dict(os.environ),
                          "umask": _umask()}).encode()  # ASCII: json escapes the rest, lone surrogates too
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    socket.send_fds(conn, [_HEADER.pack(len(request)) + request], [0, 1, 2])
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, lambda received, _frame: conn.send(bytes([received])))
    _receive_number(conn)  # the command's pid, which a caller of this process has no use for
    code = _receive_number(conn)
    if code < 0:  # ended by a signal: end by the same one, so the caller sees what it would have
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def _receive_number(conn: socket.socket) -> int:
    data = b""
    while len(data) < _NUMBER.size:
        try:
            more = conn.recv(_NUMBER.size - len(data))
        except InterruptedError:
            continue
        if not more:
            sys.exit("loopdsl fork server: the connection closed before the command ended")
        data += more
    return _NUMBER.unpack(data)[0]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


if __name__ == "__main__":
    main()
