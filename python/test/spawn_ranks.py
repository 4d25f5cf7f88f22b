"""Starts N processes of a command as the ranks of one torch.distributed run (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port), waits at most
TIMEOUT seconds for all of them, kills every one that is left, and exits with the first non-zero
status (124 on timeout). Once a rank fails, the others have 20 s before they are killed.

    spawn_ranks.py N TIMEOUT COMMAND...
"""

import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    n, timeout, command = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
    port = free_port()
    processes = []
    for rank in range(n):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        processes.append(subprocess.Popen(command, env=env))
    deadline = time.monotonic() + timeout
    status = 0
    try:
        # Poll every process; once one fails, the others get a short grace to fail too (their
        # collectives time out) and are then killed.
        while any(p.poll() is None for p in processes):
            failed = [p.returncode for p in processes if p.returncode not in (None, 0)]
            if failed and not status:
                status = failed[0]
                deadline = min(deadline, time.monotonic() + 20)
            if time.monotonic() > deadline:
                print(f"spawn_ranks: stopping {command[-1]}: timed out or a rank failed", file=sys.stderr)
                status = status or 124
                break
            time.sleep(0.1)
        status = status or next((p.returncode for p in processes if p.returncode), 0)
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    sys.exit(status)


if __name__ == "__main__":
    main()
