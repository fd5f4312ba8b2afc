#!/usr/bin/env python3
"""Checks the records of an elastic job of mirrored_bed_elastic_ids (tests/bed/elastic_ids.cpp)
against an uninterrupted run of it; tests/bed/bed_elastic.sh calls it. Prints what it found and
exits 1 when a check fails.

  elastic_ids_check.py --records DIR --reference DIR --worlds 3,2 --examples N --global-batch G
                       --epochs E [--result FILE --reference-results FILE,FILE,... --dropped-result FILE]

What counts as consumed. Attempt a of the job restored the checkpoint of step K_a (its workers'
"start" lines; K_0 = 0). A worker records a step when its update is done, before that step's
checkpoint, so the checkpoint of step K exists only if every worker of its attempt recorded steps
1..K. Attempt a's steps K_a+1 .. K_{a+1} are what the next attempt resumed from: they are
consumed (committed by the checkpoint of step K_{a+1}). Its steps after K_{a+1} were taken by a
job that then failed; their updates were lost with it (the next attempt restored the weights of
step K_{a+1}) and the next attempt takes those steps again: they are not consumed. The last
attempt consumes its steps K_last+1 .. the end, and must have finished (every worker status 0).

Checks: the attempts are those of --worlds (workers per attempt) in order; every committed step
was recorded by every replica of its attempt; each step's global batch holds G ids whatever the
number of replicas (the global batch is kept); over the committed steps every id of every epoch
is consumed exactly once; each committed step's global batch (replica slices in replica order) is
the uninterrupted run's (--reference, run with the first attempt's worker count), and on the
first attempt each replica's loss is bitwise the uninterrupted run's (the same slices and weights).
The final loss (--result) must lie within the noise of uninterrupted runs: noise is the largest
difference between the final losses of --reference-results (the same job uninterrupted on 3, 2 and
1 workers: the same global batches, whose gradients are summed in another order), the bound is
max(8 x noise, 2^-20 x the loss) (a floor for runs that happen to agree: 8 to 16 float32 ulps
of the loss, a rounding-level difference); --dropped-result (the
uninterrupted job with one batch's update dropped) must lie outside it, so that the bound can
tell a lost batch.
"""
import argparse
import os
import re
import sys
from collections import defaultdict

START = re.compile(r"^start (\d+) worker (\d+) of (\d+) restored (\d+) launched ([\d.]+) ready ([\d.]+)$")
STEP = re.compile(r"^step (\d+) epoch (\d+) replica (\d+) of (\d+) loss (\S+) ids ([\d,]*)$")
END = re.compile(r"^end (\d+) worker (-?\d+) status (\d+) at ([\d.]+) ?(.*)$")

failures = []


def fail(message):
    failures.append(message)
    print("elastic_ids_check: " + message)


def read_records(directory):
    """attempt -> {"start": {worker: (W, K, launched, ready)}, "steps": {(step, replica): (N, loss, ids)},
    "step_writes": count, "end": {worker: (status, at, error)}}"""
    attempts = defaultdict(lambda: {"start": {}, "steps": {}, "writes": 0, "end": {}})
    for name in sorted(os.listdir(directory)):
        m = re.fullmatch(r"(\d+)\.(\d+)", name)
        if not m:
            continue
        with open(os.path.join(directory, name)) as f:
            for line in f:
                line = line.rstrip("\n")
                if s := START.match(line):
                    a, w = int(s[1]), int(s[2])
                    attempts[a]["start"][w] = (int(s[3]), int(s[4]), float(s[5]), float(s[6]))
                elif s := STEP.match(line):
                    a = int(m[1])
                    key = (int(s[1]), int(s[3]))
                    rec = attempts[a]
                    rec["writes"] += 1
                    if key in rec["steps"]:
                        fail(f"attempt {a}: replica {key[1]} recorded step {key[0]} twice")
                    ids = [int(i) for i in s[6].split(",")] if s[6] else []
                    rec["steps"][key] = (int(s[4]), s[5], ids)
                elif s := END.match(line):
                    attempts[int(s[1])]["end"][int(s[2])] = (int(s[3]), float(s[4]), s[5])
                else:
                    fail(f"{name}: a line that is no record: {line!r}")
    return attempts


def final_loss(path):
    with open(path) as f:
        for line in f:
            if line.startswith("final_loss "):
                return float(line.split()[1])
    fail(f"{path} has no final_loss")
    return float("nan")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--records", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--worlds", required=True)
    p.add_argument("--examples", type=int, required=True)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--result")
    p.add_argument("--reference-results")
    p.add_argument("--dropped-result")
    a = p.parse_args()
    worlds = [int(w) for w in a.worlds.split(",")]
    steps_per_epoch = a.examples // a.global_batch
    total = steps_per_epoch * a.epochs

    records = read_records(a.records)
    reference = read_records(a.reference)
    if sorted(records) != list(range(len(worlds))):
        fail(f"the job ran attempts {sorted(records)}, expected {list(range(len(worlds)))} (workers {worlds})")
        return
    restored = []
    for attempt, world in enumerate(worlds):
        starts = records[attempt]["start"]
        if sorted(starts) != list(range(world)) or any(s[0] != world for s in starts.values()):
            fail(f"attempt {attempt} started workers {sorted(starts)} of {sorted({s[0] for s in starts.values()})}, "
                 f"expected {world} workers")
            return
        ks = {s[1] for s in starts.values()}
        if len(ks) != 1:
            fail(f"attempt {attempt}'s workers restored different steps {sorted(ks)}")
            return
        restored.append(ks.pop())
    if restored[0] != 0:
        fail(f"the first attempt restored step {restored[0]}: the checkpoint directory was not empty")
    for attempt in range(1, len(worlds)):
        k = restored[attempt]
        print(f"attempt {attempt} ({worlds[attempt]} workers) resumed from the checkpoint of step {k} "
              f"(epoch {(k - 1) // steps_per_epoch + 1}, step {(k - 1) % steps_per_epoch + 1} of {steps_per_epoch})")
        if k <= restored[attempt - 1]:
            fail(f"attempt {attempt} restored step {k}, no later than attempt {attempt - 1}'s {restored[attempt - 1]}")
        if k % steps_per_epoch == 0:
            fail(f"attempt {attempt} resumed at an epoch's end (step {k}): the fault was not mid-epoch")

    # The consumed steps, each with its attempt.
    consumed = {}
    bounds = restored + [total]
    for attempt, world in enumerate(worlds):
        first, last = bounds[attempt] + 1, bounds[attempt + 1]
        steps = records[attempt]["steps"]
        redone = sorted({s for (s, _r) in steps if s > last})
        if redone:
            print(f"attempt {attempt} took steps {redone[0]}..{redone[-1]} after the checkpoint the next attempt "
                  f"resumed from: not consumed (redone by attempt {attempt + 1})")
        if any(s < first for (s, _r) in steps):
            fail(f"attempt {attempt} recorded a step before {first}, the first after its restored checkpoint")
        for s in range(first, last + 1):
            replicas = [steps.get((s, r)) for r in range(world)]
            if any(x is None for x in replicas) or any(x[0] != world for x in replicas):
                fail(f"attempt {attempt}: step {s} (committed) was not recorded by all of its {world} replicas")
                continue
            consumed[s] = (attempt, replicas)
    ends = records[len(worlds) - 1]["end"]
    if sorted(ends) != list(range(worlds[-1])) or any(e[0] != 0 for e in ends.values()):
        fail(f"the last attempt did not finish on every worker: {ends}")
    if len(consumed) != total:
        return

    # The global batch is kept; each id once per epoch; the global batches and losses of the reference.
    ref_world = next(iter(reference[0]["start"].values()))[0] if reference[0]["start"] else 0
    sizes = defaultdict(set)
    for s, (attempt, replicas) in sorted(consumed.items()):
        batch = [i for (_n, _loss, ids) in replicas for i in ids]
        sizes[attempt].add(tuple(len(ids) for (_n, _l, ids) in replicas))
        if len(batch) != a.global_batch:
            fail(f"step {s} (attempt {attempt}): a global batch of {len(batch)} ids, not {a.global_batch}")
        ref = [reference[0]["steps"].get((s, r)) for r in range(ref_world)]
        if any(x is None for x in ref):
            fail(f"the uninterrupted run did not record step {s}")
            continue
        if batch != [i for (_n, _l, ids) in ref for i in ids]:
            fail(f"step {s} (attempt {attempt}): the global batch differs from the uninterrupted run's")
        if worlds[attempt] == ref_world and [x[1] for x in replicas] != [x[1] for x in ref]:
            fail(f"step {s} (attempt {attempt}, {ref_world} workers): the replicas' losses "
                 f"{[x[1] for x in replicas]} differ from the uninterrupted run's {[x[1] for x in ref]}")
    for attempt in sizes:
        print(f"attempt {attempt}: replica slices of each global batch {sorted(sizes[attempt])} "
              f"(global batch {a.global_batch})")
    for epoch in range(1, a.epochs + 1):
        count = defaultdict(int)
        for s in range((epoch - 1) * steps_per_epoch + 1, epoch * steps_per_epoch + 1):
            for (_n, _l, ids) in consumed[s][1]:
                for i in ids:
                    count[i] += 1
        missing = [i for i in range(a.examples) if count[i] == 0]
        twice = sorted(i for i, n in count.items() if n > 1)
        stray = sorted(i for i in count if not 0 <= i < a.examples)
        attempts = sorted({consumed[s][0] for s in range((epoch - 1) * steps_per_epoch + 1, epoch * steps_per_epoch + 1)})
        if missing or twice or stray:
            fail(f"epoch {epoch}: ids missing {missing[:10]}, taken more than once {twice[:10]}, unknown {stray[:10]}")
        else:
            print(f"epoch {epoch}: each of the {a.examples} ids consumed exactly once (attempts {attempts})")

    if a.result:
        loss = final_loss(a.result)
        refs = [final_loss(f) for f in a.reference_results.split(",")]
        noise = max(abs(x - y) for x in refs for y in refs)
        bound = max(8 * noise, 2.0**-20 * abs(refs[0]))
        dropped = final_loss(a.dropped_result)
        print(f"final loss {loss:.9g}; uninterrupted runs {', '.join(f'{x:.9g}' for x in refs)}: noise {noise:.3g}, "
              f"bound {bound:.3g}; |difference| {abs(loss - refs[0]):.3g}; a dropped batch: {dropped:.9g} "
              f"(|difference| {abs(dropped - refs[0]):.3g})")
        if not abs(loss - refs[0]) <= bound:
            fail(f"the final loss {loss!r} is not within {bound:.3g} of the uninterrupted run's {refs[0]!r}")
        if not abs(dropped - refs[0]) > bound:
            fail(f"a dropped batch's final loss {dropped!r} is within the bound {bound:.3g}: the bound cannot tell")


if __name__ == "__main__":
    main()
    sys.exit(1 if failures else 0)
