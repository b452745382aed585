#!/usr/bin/python3
"""Where a command's peak RSS lies: samples /proc/PID/status every 10 ms while it runs.

usage: rss_probe.py COMMAND [ARGS...]
Prints the child's ru_maxrss, the sampled peak VmRSS split into RssAnon and RssFile, and the
largest VmRSS while more than 100 MB of files were mapped (e.g. a weight file during loading).
Start it from a small process (a shell), not from one that holds much memory: Linux keeps a
process's peak RSS across fork and exec.
"""
import resource
import subprocess
import sys
import time


def status(pid):
    fields = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    fields[key] = int(value.split()[0])  # kB
    except OSError:
        pass
    return fields


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
    peak, mapped = (0, 0, 0), (0, 0, 0)
    while proc.poll() is None:
        s = status(proc.pid)
        if s:
            row = (s.get("VmRSS", 0), s.get("RssAnon", 0), s.get("RssFile", 0))
            peak = max(peak, row)
            if row[2] > 100_000:
                mapped = max(mapped, row)
        time.sleep(0.01)
    mib = lambda kb: kb / 1024
    print(f"exit {proc.returncode}; ru_maxrss "
          f"{mib(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss):.0f} MiB; sampled peak "
          f"VmRSS {mib(peak[0]):.0f} MiB (RssAnon {mib(peak[1]):.0f}, RssFile {mib(peak[2]):.0f})")
    if mapped[0]:
        print(f"while > 100 MB of files were mapped: VmRSS {mib(mapped[0]):.0f} MiB (RssAnon "
              f"{mib(mapped[1]):.0f}, RssFile {mib(mapped[2]):.0f})")


if __name__ == "__main__":
    main()
