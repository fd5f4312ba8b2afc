#!/usr/bin/env python3
"""Merges the flight-recorder dumps of a job's workers and prints the first divergence.

    flight_report.py DUMP.json... | DIRECTORY

Each dump is what one worker wrote (MIRRORED_FLIGHT_RECORDER_DIR=dir gives
dir/flight_recorder.worker<W>.json on a timeout, stall, abort or peer loss;
mirrored::flight_recorder::dump(path) on demand). Every replica of every worker numbers its
collectives the same way, so the same sequence number must name the same call everywhere. The
report is the first number at which they do not: replicas that made a different call there, and
replicas that never got there (behind), named by worker, replica and device; a table of every
replica's state at that number follows. Workers the job has but whose dump is missing are named
too (a stopped or killed worker cannot write one).

Exit status: 0 with a report (or "no divergence"), 2 on unreadable input.
"""

import glob
import json
import os
import sys


def load(paths):
    dumps = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            dumps.append(json.load(f))
    return dumps


def replicas_of(dumps):
    """(worker, replica, device, {seq: entry}) for each replica of each worker (the newest
    strategy of each dump: the one a job runs)."""
    out = []
    for d in dumps:
        strategies = d.get("strategies") or []
        if not strategies:
            continue
        for rep in strategies[-1]["replicas"]:
            entries = {e["seq"]: e for e in rep["entries"]}
            out.append((d["worker"], rep["replica"], rep["device"], entries))
    out.sort(key=lambda r: (r[0], r[1]))
    return out


def last_done(entries):
    done = [s for s, e in entries.items() if e["state"] == "done"]
    return max(done) if done else 0


def who(rep):
    return "worker %d replica %d (%s)" % (rep[0], rep[1], rep[2])


def report(dumps):
    lines = []
    num_workers = max([d.get("num_workers", 1) for d in dumps] or [1])
    present = {d["worker"] for d in dumps}
    missing = [w for w in range(num_workers) if w not in present]
    reps = replicas_of(dumps)
    if not reps:
        return ["no flight-recorder entries in the dumps"]
    # The numbers every replica's ring still holds (older ones were overwritten).
    lows = [min(r[3]) if r[3] else None for r in reps]
    start = max([lo for lo in lows if lo is not None] or [1])
    high = max([max(r[3]) for r in reps if r[3]] or [0])
    divergence = None
    for seq in range(start, high + 1):
        kinds = [r[3][seq]["kind"] if seq in r[3] else None for r in reps]
        if len(set(kinds)) > 1:
            divergence = seq
            break
    if divergence is None:
        lines.append("no divergence: every replica made the same calls up to #%d" % high)
    else:
        seq = divergence
        kinds = [r[3][seq]["kind"] for r in reps if seq in r[3]]
        # The call most replicas made there (ties: the first in worker order, like the library's reports).
        reference = max(dict.fromkeys(kinds), key=kinds.count) if kinds else None
        lines.append("first divergence at #%d (most replicas: %s)" % (seq, reference))
        for r in reps:
            if seq not in r[3]:
                done = last_done(r[3])
                lines.append("%s is behind: last completed #%d and never entered #%d" % (who(r), done, seq))
            elif r[3][seq]["kind"] != reference:
                lines.append("%s made a different call at #%d: %s instead of %s"
                             % (who(r), seq, r[3][seq]["kind"], reference))
    for w in missing:
        lines.append("worker %d wrote no dump (stopped, hung or killed before it could)" % w)
    # The table of every replica's state at the divergence (or at the last number).
    at = divergence if divergence is not None else high
    lines.append("")
    header = ("worker", "replica", "device", "#%d" % at, "state", "last completed")
    rows = []
    for r in reps:
        e = r[3].get(at)
        rows.append((str(r[0]), str(r[1]), r[2], e["kind"] if e else "-", e["state"] if e else "-",
                     "#%d" % last_done(r[3])))
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    fmt = "  ".join("%%-%ds" % w for w in widths)
    lines.append(fmt % header)
    for row in rows:
        lines.append(fmt % row)
    return lines


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    paths = []
    for a in argv[1:]:
        if os.path.isdir(a):
            paths.extend(sorted(glob.glob(os.path.join(a, "flight_recorder.worker*.json"))))
        else:
            paths.append(a)
    try:
        dumps = load(paths)
    except (OSError, ValueError, KeyError) as e:
        print("flight_report.py: cannot read the dumps: %s" % e, file=sys.stderr)
        return 2
    if not dumps:
        print("flight_report.py: no dumps given", file=sys.stderr)
        return 2
    print("\n".join(report(dumps)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
