#!/usr/bin/env python3
"""Merges the flight-recorder dumps of a job's workers and prints the first divergence.

    flight_report.py [--attempt K] DUMP.json... | DIRECTORY

Each dump is what one worker wrote (MIRRORED_FLIGHT_RECORDER_DIR=dir gives
dir/flight_recorder.worker<W>.json on a timeout, stall, abort or peer loss;
mirrored::flight_recorder::dump(path) on demand). Every replica of every worker numbers its
collectives the same way, so the same sequence number must name the same call everywhere. The
report is the first number at which they do not: replicas that made a different call there, and
replicas that never got there (behind), named by worker, replica and device; a table of every
replica's state at that number follows. Workers the job has but whose dump is missing are named
too (a stopped or killed worker cannot write one).

A dump names its job and attempt ("job_id": MIRRORED_JOB_ID, "attempt": MIRRORED_RESTART_COUNT,
both set by tools/launch.sh). A directory can hold dumps of several attempts of a job restarted by
the launcher (a worker that wrote none in the newest attempt leaves its older one): only the
dumps of one attempt are merged, the newest unless --attempt K names another, and the report's
first line says which it used and which dumps it left out. Dumps of different jobs with the same
attempt, or dumps with and without a job and attempt, are refused: there is no telling which
belong together (name the files of one job instead of the directory).

Exit status: 0 with a report (or "no divergence"), 2 on unreadable or malformed input, or dumps
that do not belong to one job.
"""

import glob
import json
import os
import sys


class Refused(Exception):
    """Input the report cannot be made of: the message says why."""


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _check(cond, path, what):
    if not cond:
        raise Refused("%s: not a flight-recorder dump: %s" % (path, what))


def check_dump(path, d):
    """Raises Refused unless `d` has the shape the report reads."""
    _check(isinstance(d, dict), path, "a JSON object expected, not %s" % type(d).__name__)
    _check(_is_int(d.get("worker")) and d["worker"] >= 0, path, '"worker" must be a number >= 0')
    _check(_is_int(d.get("num_workers", 1)) and d.get("num_workers", 1) >= 1, path,
           '"num_workers" must be a number >= 1')
    _check(d.get("job_id") is None or isinstance(d["job_id"], str), path, '"job_id" must be a string or null')
    _check(d.get("attempt") is None or (_is_int(d["attempt"]) and d["attempt"] >= 0), path,
           '"attempt" must be a number >= 0 or null')
    strategies = d.get("strategies", [])
    _check(isinstance(strategies, list), path, '"strategies" must be a list')
    for i, st in enumerate(strategies):
        _check(isinstance(st, dict) and isinstance(st.get("replicas"), list), path,
               'strategy %d must be an object with a "replicas" list' % i)
        for rep in st["replicas"]:
            _check(isinstance(rep, dict) and _is_int(rep.get("replica")) and isinstance(rep.get("device"), str)
                   and isinstance(rep.get("entries"), list), path,
                   'a replica must be an object with "replica" (a number), "device" (a string) and "entries" (a list)')
            for e in rep["entries"]:
                _check(isinstance(e, dict), path, "an entry must be an object")
                _check(_is_int(e.get("seq")), path, 'an entry without a "seq" number: %s' % json.dumps(e)[:200])
                _check(isinstance(e.get("kind"), str) and isinstance(e.get("state"), str), path,
                       'entry #%d without a "kind" or "state" string' % e["seq"])


def load(paths):
    """[(path, dump)], each dump checked. Raises Refused."""
    dumps = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError) as e:  # ValueError: bad JSON or bad UTF-8
            raise Refused("cannot read %s: %s" % (path, e))
        check_dump(path, d)
        dumps.append((path, d))
    return dumps


def attempt_of(d):
    return (d.get("job_id"), d.get("attempt"))


def describe(key):
    job, attempt = key
    if job is None and attempt is None:
        return "no job id or attempt"
    return "attempt %s, job %s" % ("?" if attempt is None else attempt, "?" if job is None else job)


def choose_attempt(dumps, wanted=None):
    """(the dumps of one attempt, a note naming it and the dumps left out, or None when all are of
    one attempt). Raises Refused when the dumps do not belong to one job."""
    keys = {attempt_of(d) for _, d in dumps}
    if len(keys) == 1 and wanted is None:
        return [d for _, d in dumps], None
    unknown = sorted(p for p, d in dumps if d.get("attempt") is None)
    if unknown:
        raise Refused("cannot tell which dumps belong together: %s named no attempt, the others did (%s)"
                      % (", ".join(unknown), "; ".join(sorted(describe(k) for k in keys if k[1] is not None))))
    attempts = sorted({k[1] for k in keys})
    chosen = attempts[-1] if wanted is None else wanted
    if chosen not in attempts:
        raise Refused("no dump of attempt %d (the dumps are of attempt %s)"
                      % (chosen, ", ".join(str(a) for a in attempts)))
    jobs = sorted({str(k[0]) for k in keys if k[1] == chosen})
    if len(jobs) > 1:
        raise Refused("the dumps of attempt %d are of different jobs (%s): name the files of one job"
                      % (chosen, ", ".join(jobs)))
    used = [d for _, d in dumps if d["attempt"] == chosen]
    left = ["%s (%s)" % (p, describe(attempt_of(d))) for p, d in dumps if d["attempt"] != chosen]
    note = "using attempt %d (job %s)%s" % (chosen, jobs[0], "; left out: " + ", ".join(left) if left else "")
    return used, note


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
    args = argv[1:]
    wanted = None
    if len(args) >= 2 and args[0] == "--attempt":
        if not args[1].isdigit() or not args[1].isascii():
            print("flight_report.py: --attempt must be a whole number, not %r" % args[1], file=sys.stderr)
            return 2
        wanted = int(args[1])
        args = args[2:]
    if not args or args[0].startswith("--"):
        print(__doc__, file=sys.stderr)
        return 2
    paths = []
    for a in args:
        if os.path.isdir(a):
            paths.extend(sorted(glob.glob(os.path.join(a, "flight_recorder.worker*.json"))))
        else:
            paths.append(a)
    if not paths:
        print("flight_report.py: no dumps given", file=sys.stderr)
        return 2
    try:
        dumps, note = choose_attempt(load(paths), wanted)
    except Refused as e:
        print("flight_report.py: %s" % e, file=sys.stderr)
        return 2
    if note:
        print("flight_report.py: " + note)
    print("\n".join(report(dumps)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
