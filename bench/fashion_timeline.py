"""Where a training step of fashion_mnist goes, from its timeline (`--timeline`, docs/timeline.md).
Python 3 standard library only.

For every training step but the first and the last of the file (a step is a `run` whose replica 0
thread holds an `apply_gradients`; test steps hold none), on each replica thread:

  step      from the step's dispatch (the earliest replica's `run` begins) to the next step's
  exposed   the replica's time in communication: its collectives (`all_reduce`, and
            `apply_gradients` where it communicates, i.e. holds a `rendezvous`) and its waits for
            asynchronous ones (`all_reduce_async.wait`), the rendezvous (waiting for the other
            replicas) included
  compute   the rest of its `run`: the forward and backward pass, the input, a local update
  rest      step - compute - exposed: between the runs (the caller's loop, the next batch, the
            hand-out) and the replicas' differences
  comm      the communication's own time, waits left out: every collective's span less its
            rendezvous, on the replica thread and on its communication thread
            (`all_reduce_async` on "communication r": the buckets that overlap the backward pass)
  wait      the part of exposed spent in rendezvous on the replica thread: waiting for the other
            replicas to arrive, i.e. the step-to-step differences of their compute times (on a
            shared VM mostly the other tenants'), which no way of communicating removes

averaged over the replicas, then over the steps (means, in ms), and the overlap, the fraction of
the communication hidden behind compute:

  overlap = (compute + comm - (step - rest)) / comm = (comm - exposed) / comm

which is 0 for communication done after the compute, and negative when the replicas also wait for
each other there (imbalance).
"""
import bisect
import collections
import json
import statistics
from pathlib import Path

COMMUNICATING = {"all_reduce", "all_reduce_async.wait", "reduce_scatter", "all_gather", "merge_call"}


class _Track:
    """One thread's complete events, sorted by start."""

    def __init__(self, events):
        self.events = sorted(events, key=lambda e: e["ts"])
        self.starts = [e["ts"] for e in self.events]

    def within(self, begin, end):
        """Events that begin in [begin, end)."""
        lo, hi = bisect.bisect_left(self.starts, begin), bisect.bisect_left(self.starts, end)
        return self.events[lo:hi]


def _outermost(events):
    """The events not inside another of the list (same thread: they nest)."""
    out, until = [], float("-inf")
    for e in events:
        if e["ts"] >= until:
            out.append(e)
            until = e["ts"] + e["dur"]
    return out


def _waits_inside(track, e):
    return sum(r["dur"] for r in track.within(e["ts"], e["ts"] + e["dur"]) if r["name"] == "rendezvous")


def step_breakdown(path):
    """The means described in the module's comment, in ms, with `steps` (how many were averaged)
    and `replicas`. Raises ValueError for a timeline without two training steps."""
    trace = json.loads(Path(path).read_text())
    names, by_tid, runs = {}, collections.defaultdict(list), collections.defaultdict(dict)
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e["args"]["name"]
        elif e.get("ph") == "X":
            by_tid[e["tid"]].append(e)
            if e["name"] == "run":
                runs[e["args"]["step"]][e["args"]["replica"]] = e
    tracks = {tid: _Track(ev) for tid, ev in by_tid.items()}
    lanes = {int(n.split()[-1]): tid for tid, n in names.items() if n.startswith("communication ")}

    def is_training(step):
        r0 = runs[step].get(0)
        return r0 is not None and any(e["name"] == "apply_gradients"
                                      for e in tracks[r0["tid"]].within(r0["ts"], r0["ts"] + r0["dur"]))

    order = sorted(runs)
    training = [k for k in order if is_training(k)]
    rows = []
    for k in training[1:-1]:
        nxt = order[order.index(k) + 1]
        start = min(e["ts"] for e in runs[k].values())
        step = min(e["ts"] for e in runs[nxt].values()) - start
        per = []
        for r, run in runs[k].items():
            track = tracks[run["tid"]]
            inner = _outermost([e for e in track.within(run["ts"], run["ts"] + run["dur"]) if e is not run])
            comm_events = [e for e in inner if e["name"] in COMMUNICATING or
                           (e["name"] == "apply_gradients" and _waits_inside(track, e) > 0)]
            exposed = sum(e["dur"] for e in comm_events)
            # The communication's own work: the waits for the other replicas left out. Waiting for an
            # asynchronous result is no work of its own: the communication thread's span counts it.
            comm = sum(e["dur"] - _waits_inside(track, e) for e in comm_events if e["name"] != "all_reduce_async.wait")
            if r in lanes:
                lane = tracks[lanes[r]]
                for e in lane.within(run["ts"], run["ts"] + run["dur"]):
                    if e["name"] in ("all_reduce_async", "reduce_scatter_async"):
                        comm += e["dur"] - _waits_inside(lane, e)
            wait = sum(_waits_inside(track, e) for e in comm_events)
            per.append((run["dur"] - exposed, exposed, comm, wait))
        compute = statistics.mean(p[0] for p in per)
        exposed = statistics.mean(p[1] for p in per)
        comm = statistics.mean(p[2] for p in per)
        rows.append({"step": step, "compute": compute, "exposed": exposed, "rest": step - compute - exposed,
                     "comm": comm, "wait": statistics.mean(p[3] for p in per)})
    if not rows:
        raise ValueError(f"{path}: fewer than three training steps in the timeline")
    out = {key: statistics.mean(r[key] for r in rows) / 1000 for key in rows[0]}
    out["overlap"] = (out["comm"] - out["exposed"]) / out["comm"] if out["comm"] > 0 else None
    out["steps"] = len(rows)
    out["replicas"] = len(runs[training[0]])
    return out


if __name__ == "__main__":
    import sys
    for p in sys.argv[1:]:
        print(p, json.dumps(step_breakdown(p), indent=1))
