"""The peak resident memory of a process tree, as the benches measure it: the largest VmHWM of
the process and its descendants (every rank and the launcher), polled from /proc every 0.2 s."""
import os
import threading


def tree_pids(root):
    """root and all its descendants (from /proc/*/stat parent links)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c, pp in parent.items() if pp == p)
    return out


class PeakRss:
    """with PeakRss(pid) as m: ... wait for the process ...; then m.peak is the bytes."""

    def __init__(self, pid, every_s=0.2):
        self.pid, self.every_s, self.peak = pid, every_s, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._done.is_set():
            for pid in tree_pids(self.pid):
                try:
                    with open(f"/proc/{pid}/status") as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                self.peak = max(self.peak, int(line.split()[1]) * 1024)
                except OSError:
                    pass
            self._done.wait(self.every_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        return False
