"""The command the corpus runner has the SDK client and `dharma stdio` start: hands this
process's stdin, stdout, stderr and working directory, with a program and its arguments, to the
corpus zygote (tests/corpus/zygote.py), which forks the program onto them; exits with the
program's exit status.

    python -I -S tests/corpus/launch.py SOCKET server CASE_FILE CASE_ID
    python -I -S tests/corpus/launch.py SOCKET dharma ARGS...

Standard library only and no site import, so it starts in milliseconds.
"""

import os
import socket
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: launch.py SOCKET server|dharma ARGS...\n")
        return 2
    path, request = argv[0], [os.getcwd(), *argv[1:]]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        socket.send_fds(conn, ["\0".join(request).encode()], [0, 1, 2])
        status = conn.recv(1)
    except OSError as exc:
        sys.stderr.write(f"launch.py: the corpus zygote at {path} is unreachable: {exc}\n")
        return 1
    return status[0] if status else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
