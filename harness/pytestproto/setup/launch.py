"""Starts a test phase as N rank processes on one machine, as torchrun's standalone mode does.

usage: launch.py N -- COMMAND...

The harness opens one report channel per rank: rank r's nonce pipe is fd 3+2r and its report
pipe fd 4+2r. Each rank runs COMMAND with its own pair as fds 3 and 4 (where the report plugin
looks) and RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and
MASTER_PORT set (and INFRADEV_RANK, which the report plugin reads: the others may be the
environment's own defaults when there is one process); this process keeps none of the pipes,
so a report ends when its rank does.

A rank that dies of a signal (a crash) while others run leaves them GRACE seconds to finish
and then kills them: they would otherwise wait for it in a collective until the phase times
out. Exit status: the first crashed rank's 128+signal, else the ranks' exit code when they
agree, else the highest. Whatever the status, the harness grades each rank's own report.
"""

import os
import signal
import socket
import subprocess
import sys
import time

GRACE = float(os.environ.get("INFRADEV_LAUNCH_GRACE", "10"))


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: launch.py N -- COMMAND...")
    n = int(sys.argv[1])
    cmd = sys.argv[3:]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), INFRADEV_RANK=str(r))

        def channel(r=r):
            # Runs in the child before the descriptors other than 0-2 and pass_fds are closed.
            if r:
                os.dup2(3 + 2 * r, 3)
                os.dup2(4 + 2 * r, 4)

        procs.append(subprocess.Popen(cmd, env=env, pass_fds=(3, 4), preexec_fn=channel))
    for fd in range(3, 3 + 2 * n):
        os.close(fd)

    codes = [None] * n
    crashed = None
    killed_at = None
    while None in codes:
        for r, p in enumerate(procs):
            if codes[r] is None and p.poll() is not None:
                codes[r] = p.returncode
                if p.returncode < 0 and crashed is None and killed_at is None:
                    crashed = r
        if crashed is not None and killed_at is None and None in codes:
            deadline = time.monotonic() + GRACE
            while None in codes and time.monotonic() < deadline:
                time.sleep(0.1)
                for r, p in enumerate(procs):
                    if codes[r] is None and p.poll() is not None:
                        codes[r] = p.returncode
            for r, p in enumerate(procs):
                if codes[r] is None:
                    p.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
        time.sleep(0.05)
    if crashed is not None:
        sys.exit(128 - codes[crashed])
    normal = [c if c >= 0 else 128 - c for c in codes]
    sys.exit(normal[0] if len(set(normal)) == 1 else max(normal))


if __name__ == "__main__":
    main()
