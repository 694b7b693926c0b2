"""Issue 14 item 8 on real bwrap sandboxes: memory the old statm sum missed (MAP_SHARED anonymous memory,
memfds, /dev/shm and the sandbox's /tmp tmpfs) counts against sandbox.mem_gb; a hostile tree past the
limit is killed by the watchdog and the shell comes back."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hpc.config.sandbox import SandboxConfig
from rollout_node.sandbox import open_sandbox
from tests.sandbox.sbx_helpers import need_runtime

LIMIT_GB = 0.5  # 512 MiB; each hostile tree below holds ~700 MiB, none of it private anonymous memory
CFG = SandboxConfig(runtime="bwrap", mem_gb=LIMIT_GB, tmp_mb=1024, max_file_mb=1024, command_timeout_s=60)
MARK = "spoolrl-shm-hog"
HOGS = {
    "memfd": f"python3 -c 'import os, time; fd = os.memfd_create(\"{MARK}\"); "
             "[os.write(fd, b\"x\" * (1 << 20)) for _ in range(700)]; time.sleep(120)'",
    "shared_mmap": "for i in 1 2; do python3 -c 'import mmap, time; m = mmap.mmap(-1, 350 << 20); "
                   "[m.write(b\"x\" * (1 << 20)) for _ in range(350)]; time.sleep(120)' " + MARK + " & done; wait",
    "dev_shm": f"dd if=/dev/zero of=/dev/shm/{MARK} bs=1M count=700 2>/dev/null; sleep 120",
    "tmp_tmpfs": f"dd if=/dev/zero of=/tmp/{MARK} bs=1M count=700 2>/dev/null; sleep 120",
}


def _sleepers() -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmd = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if MARK.encode() in cmd or (b"sleep\x00120" in cmd):
                found.append(int(name))
    return found


@pytest.mark.parametrize("kind", sorted(HOGS))
def test_shared_memory_and_tmpfs_count_against_the_limit(kind: str, tmp_path: Path) -> None:
    need_runtime("bwrap")
    with open_sandbox(CFG, tmp_path) as sb:
        hog = sb.run(HOGS[kind], timeout_s=60)
        after = sb.run("echo alive; ls /dev/shm /tmp")
    assert not hog.timed_out, hog  # killed long before the 120 s sleep or the command timeout
    assert "watchdog" in hog.output and "memory" in hog.output, hog
    assert after.output.startswith("alive\n") and MARK not in after.output, after  # a fresh sandbox, tmpfs gone
    deadline = time.monotonic() + 10
    while _sleepers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _sleepers(), "hog processes survived the kill"


def test_below_the_limit_shared_memory_is_left_alone(tmp_path: Path) -> None:
    """The same kinds of memory, 200 MiB in all: nothing is killed (the accounting is not just 'kill')."""
    need_runtime("bwrap")
    with open_sandbox(CFG, tmp_path) as sb:
        r = sb.run("dd if=/dev/zero of=/dev/shm/a bs=1M count=100 2>/dev/null && python3 -c 'import os, time; "
                   "fd = os.memfd_create(\"m\"); [os.write(fd, b\"x\" * (1 << 20)) for _ in range(100)]; "
                   "time.sleep(1); print(\"held\")'", timeout_s=60)
    assert r.output.strip().endswith("held") and "watchdog" not in r.output, r
