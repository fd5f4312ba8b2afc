#!/usr/bin/env bash
# A fault on the cluster bed (tools/cluster_bed.sh), timed: runs a multi-worker job on H hosts (W
# workers each, one per host by default), injects FAULT into worker VICTIM after it trains, and
# checks that every survivor ends with an UnavailableError naming the victim (or the pair cut)
# within the peer timeout + 2 s of the fault, all with the same cause. Prints one line per
# survivor: "survivor <rank> <seconds after the fault> <exit status>: <the error>".
#   bed_fault.sh BIN FAULT VICTIM [--hosts H] [--workers-per-host W] [--replicas R] [--peer-timeout S]
#                                [--expect lost|pair|never-joined|none] [--heal-after S] [--program digits|big|collectives|agreement]
#                                [--expect-log REGEX (every worker, or every survivor, logs a matching line)]
#                                [--at-start 1 (the fault before the job starts: --expect never-joined)]
#                                [--collective-timeout S (MIRRORED_COLLECTIVE_TIMEOUT_S, also the start-up's)]
# FAULT: partition-both, partition-in, partition-out, link-down, stop, kill, cut (VICTIM and
# --cut-peer lose each other only), cap (--cap RATE: a slow link, nothing must fail: --expect none).
# BIN: the build directory (train_digits and tests/mirrored_mw_worker in it). Exit 77 (skip)
# when no bed can be made here (not root, no namespaces).
set -euo pipefail
# Arithmetic on seconds with fractions (awk: no bc needed).
calc() { awk "BEGIN { print $* }"; }
holds() { awk "BEGIN { exit !($*) }"; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bed="$here/tools/cluster_bed.sh"
bin=$1 fault=$2 victim=$3
shift 3
hosts=3 per_host=1 replicas=1 peer_timeout=3 expect=lost heal_after="" cut_peer="" cap_rate="" settle=1
program=digits expect_log="" at_start=0 collective_timeout=1800
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2 ;;
    --workers-per-host) per_host=$2 ;;
    --replicas) replicas=$2 ;;
    --peer-timeout) peer_timeout=$2 ;;
    --expect) expect=$2 ;;
    --heal-after) heal_after=$2 ;;
    --cut-peer) cut_peer=$2 ;;
    --cap) cap_rate=$2 ;;
    --program) program=$2 ;;
    --settle) settle=$2 ;;
    --expect-log) expect_log=$2 ;;
    --at-start) at_start=$2 ;;
    --collective-timeout) collective_timeout=$2 ;;
    *) echo "bed_fault: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done

source "$here/tests/bed/bed_up.sh"
bed_up "$hosts"

workers=$((hosts * per_host))
# A capped link is capped from the start.
[ -z "$cap_rate" ] || { for ((h = 0; h < hosts; h++)); do "$bed" cap "$h" "$cap_rate"; done; }
host_of() { echo $(($1 / per_host)); }
addresses=()
for ((w = 0; w < workers; w++)); do
  addresses+=("\"$("$bed" addr "$(host_of $w)"):$((2222 + w % per_host))\"")
done
cluster=$(IFS=,; echo "${addresses[*]}")
devices=$(for ((r = 0; r < replicas; r++)); do printf 'CPU:%d,' "$r"; done)
devices=${devices%,}

vpid=""
vhost=$(host_of "$victim")
inject() {
  vpid=$(cat "$work/pid.$victim" 2>/dev/null || true)
  case "$fault" in
    partition-both) "$bed" partition "$vhost" both ;;
    partition-in) "$bed" partition "$vhost" in ;;
    partition-out) "$bed" partition "$vhost" out ;;
    link-down) "$bed" link "$vhost" down ;;
    stop) kill -STOP "$vpid" ;;
    kill) kill -KILL "$vpid" ;;
    cut) "$bed" cut "$vhost" "$(host_of "$cut_peer")" ;;
    none | cap) ;;
      *) echo "bed_fault: unknown fault $fault" >&2; exit 2 ;;
  esac
}

# A host that never answers: its fault comes first, and its worker never starts.
if [ "$at_start" = 1 ]; then
  t0=$(date +%s.%N)
  inject
fi
for ((w = 0; w < workers; w++)); do
  [ "$at_start" = 1 ] && [ "$w" -eq "$victim" ] && continue
  tf_config="{\"cluster\": {\"worker\": [$cluster]}, \"task\": {\"type\": \"worker\", \"index\": $w}}"
  case "$program" in
    digits) cmd=("$bin/train_digits" --strategy multi_worker --devices "$devices" --epochs 100000) ;;
    big) cmd=("$bin/tests/mirrored_mw_worker" big --replicas "$replicas" --step 2 --elements 400000 --timeout 600) ;;
    collectives) cmd=("$bin/tests/mirrored_mw_worker" collectives --replicas "$replicas" --timeout 60) ;;
    agreement) cmd=("$bin/tests/mirrored_mw_worker" agreement_loop --replicas "$replicas" --timeout 600) ;;
    *) echo "bed_fault: unknown program $program" >&2; exit 2 ;;
  esac
  # The wrapper records the program's pid and its exit time (when its error was printed).
  "$bed" run "$(host_of $w)" env TF_CONFIG="$tf_config" MIRRORED_PEER_TIMEOUT_S="$peer_timeout" MIRRORED_LOG_LEVEL=INFO \
    MIRRORED_COLLECTIVE_TIMEOUT_S="$collective_timeout" MIRRORED_STALL_WARN_S="${MIRRORED_STALL_WARN_S:-60}" \
    bash -c '"$@" > '"$work/out.$w"' 2>&1 & echo $! > '"$work/pid.$w"'; wait $!; echo "$? $(date +%s.%N)" > '"$work/exit.$w" \
    _ "${cmd[@]}" &
  disown  # killed with the bed at the end: no job report
done

# Training under way: every worker joined (its INFO line on stderr, which is not buffered; 60 s
# at most, however loaded the machine) and has trained for --settle seconds.
if [ "$at_start" != 1 ]; then
  for ((w = 0; w < workers; w++)); do
    for ((i = 0; i < 600; i++)); do grep -q "joined a job of" "$work/out.$w" 2>/dev/null && break; sleep 0.1; done
  done
fi
sleep "$settle"
for ((w = 0; w < workers; w++)); do
  if [ "$expect" != none ] && [ "$at_start" != 1 ] && [ -e "$work/exit.$w" ]; then
    echo "bed_fault: worker $w ended before the fault:"; cat "$work/out.$w"; exit 1
  fi
done

if [ "$at_start" != 1 ]; then
  t0=$(date +%s.%N)
  inject
fi

# Every survivor (and, once healed, the victim) ends; none may take longer than this.
limit=$(calc "$peer_timeout + 30")
# A host's fault takes every worker on it; a process's only that one.
survivors=() lost=()
for ((w = 0; w < workers; w++)); do
  case "$fault" in
    partition-* | link-down) [ "$(host_of "$w")" -eq "$vhost" ] && { lost+=("$w"); continue; } ;;
    none) [ "$at_start" = 1 ] && [ "$w" -eq "$victim" ] && { lost+=("$w"); continue; } ;;
    stop | kill) [ "$w" -eq "$victim" ] && { lost+=("$w"); continue; } ;;
  esac
  survivors+=("$w")
done
if [ -n "$heal_after" ]; then
  sleep "$heal_after"
  case "$fault" in
    partition-* | cut) "$bed" heal "$vhost" ;;
    link-down) "$bed" link "$vhost" up ;;
    stop) kill -CONT "$vpid" ;;
  esac
fi
status=0
if [ "$expect" = none ]; then
  # Nothing fails: every worker ends by itself, successfully.
  for ((w = 0; w < workers; w++)); do
    while [ ! -e "$work/exit.$w" ]; do sleep 0.2; done
    read -r rc _ < "$work/exit.$w"
    echo "worker $w exit $rc: $(grep -E 'took|Error' "$work/out.$w" | tr '\n' ';')"
    [ "$rc" -eq 0 ] || { echo "bed_fault: worker $w failed:"; cat "$work/out.$w"; status=1; }
    if [ -n "$expect_log" ] && ! grep -qE "$expect_log" "$work/out.$w"; then
      echo "bed_fault: worker $w's log has no line matching /$expect_log/:"; cat "$work/out.$w"; status=1
    fi
  done
  exit $status
fi
case "$expect" in
  lost) pattern="worker ($(IFS='|'; echo "${lost[*]}")) \\([^)]*\\) is (lost|gone)" ;;
  pair) pattern="cannot reach each other" ;;
  never-joined) pattern="worker ($(IFS='|'; echo "${lost[*]}")) \\([^)]*\\) (has|have) not joined the job" ;;
  *) echo "bed_fault: --expect lost, pair, never-joined or none" >&2; exit 2 ;;
esac
bound=$(calc "$peer_timeout + 2")
# A worker that never joins is found at the start-up timeout (a late start looks the same); the
# chief waits 2 s longer, so that the others, whose store it serves, report first.
[ "$expect" != never-joined ] || bound=$(calc "$collective_timeout + 4")
# Waits until worker $1 has ended ($2 names it), at most until $limit s after the fault.
wait_for_end() {
  while [ ! -e "$work/exit.$1" ]; do
    if holds "$(date +%s.%N) - $t0 > $limit"; then
      echo "bed_fault: $2 $1 still runs $limit s after the fault (a hang):"; cat "$work/out.$1"; exit 1
    fi
    sleep 0.1
  done
}
# The first error line worker $1 printed.
error_of() { grep -m1 -E "UNAVAILABLE|DEADLINE_EXCEEDED|FAILED_PRECONDITION|Error" "$work/out.$1" || true; }
causes=()
for w in "${survivors[@]}"; do
  wait_for_end "$w" survivor
  read -r rc t < "$work/exit.$w"
  took=$(calc "$t - $t0")
  error=$(error_of "$w")
  printf 'survivor %d %.2f s exit %d: %s\n' "$w" "$took" "$rc" "$error"
  if [ "$rc" -eq 0 ]; then echo "bed_fault: survivor $w ended without an error"; status=1; fi
  if ! grep -qE "$pattern" <<<"$error"; then
    echo "bed_fault: survivor $w's error does not match /$pattern/; its output:"; tail -n 20 "$work/out.$w"; status=1
  fi
  if holds "$took > $bound"; then echo "bed_fault: survivor $w took $took s > $bound s"; status=1; fi
  if [ -n "$expect_log" ] && ! grep -qE "$expect_log" "$work/out.$w"; then
    echo "bed_fault: survivor $w's log has no line matching /$expect_log/"; status=1
  fi
  causes+=("$(grep -oE "$pattern[^;]*" <<<"$error" | head -1 || true)")
done
if [ "$(printf '%s\n' "${causes[@]}" | sort -u | wc -l)" -ne 1 ]; then
  echo "bed_fault: the survivors report different causes:"; printf '  %s\n' "${causes[@]}"; status=1
fi
if [ -n "$heal_after" ] && [ "$fault" != kill ]; then
  # Healed after detection, the victim's side must fail too (never go on alone).
  wait_for_end "$victim" "the healed victim"
  read -r rc t < "$work/exit.$victim"
  printf 'victim %d %.2f s exit %d: %s\n' "$victim" "$(calc "$t - $t0")" "$rc" "$(error_of "$victim")"
  [ "$rc" -ne 0 ] || { echo "bed_fault: the healed victim went on and ended successfully"; status=1; }
fi
exit $status
