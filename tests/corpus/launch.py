"""The command `dharma stdio` starts for a corpus case: hands this process's stdin, stdout and
stderr to the corpus server's zygote (tests/corpus/server.py --zygote), which forks the case's
MCP server onto them, then exits with that server's exit status.

    python -I -S tests/corpus/launch.py SOCKET CASE_FILE CASE_ID

Standard library only and no site import, so it starts in milliseconds.
"""

import socket
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write("usage: launch.py SOCKET CASE_FILE CASE_ID\n")
        return 2
    path, case_file, case_id = argv
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        socket.send_fds(conn, [f"{case_file}\0{case_id}".encode()], [0, 1, 2])
        status = conn.recv(1)
    except OSError as exc:
        sys.stderr.write(f"launch.py: the corpus server zygote at {path} is unreachable: {exc}\n")
        return 1
    return status[0] if status else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
