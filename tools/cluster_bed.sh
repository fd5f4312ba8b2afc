#!/usr/bin/env bash
# A cluster of K "hosts" on this machine, for tests of what a real cluster does to a job: each host
# is a network namespace with its own IPC and UTS namespaces (own shared memory, own host name) and
# one address on a bridge. The bridge lives in a namespace of its own, so the machine's own network
# is never touched; addresses come from a documentation range (198.51.100.0/24) and there is no
# default route. Faults: a host's link capped (tbf: these kernels have no netem), a host
# partitioned (nftables drops: both ways, only in, only out) and healed, a host's link taken down.
# Needs root, iproute2, util-linux (unshare, nsenter), tc and nft (Debian's nftables).
#
#   tools/cluster_bed.sh check                 exit 0 when a bed can be made here; else prints why, exit 77
#   tools/cluster_bed.sh up K                  makes hosts 0..K-1 (prints the bed's prefix)
#   tools/cluster_bed.sh addr H                host H's address (198.51.100.10+H)
#   tools/cluster_bed.sh run H CMD [ARG...]    runs CMD on host H (in its namespaces; the caller's
#                                              user, files and environment)
#   tools/cluster_bed.sh cap H RATE            caps host H's link both ways (RATE as tc writes it: 4mbit)
#   tools/cluster_bed.sh uncap H
#   tools/cluster_bed.sh partition H both|in|out   drops host H's packets (in: what reaches it)
#   tools/cluster_bed.sh cut H G               hosts H and G lose each other (both still reach the rest)
#   tools/cluster_bed.sh heal H                undoes partition and cut
#   tools/cluster_bed.sh link H down|up        the host's link (its switch port) down or up
#   tools/cluster_bed.sh down                  removes this bed (every process on its hosts killed)
#   tools/cluster_bed.sh clean [--all]         removes every bed whose owner is gone (a killed run's;
#                                              --all: every bed, also those of runs in progress)
#
# The bed is named by MIRRORED_BED (a prefix "mbed" + 4 hex digits); `up` makes one and prints it,
# every other command needs it exported. Its owner is MIRRORED_BED_OWNER (a pid; default: the
# caller's), and `clean` removes the beds whose owner no longer runs. Names: namespaces PREFIX-sw (the bridge) and PREFIX-hH,
# namespace files under /run/mirrored-bed/PREFIX/.
set -euo pipefail

readonly SUBNET=198.51.100
readonly STATE=/run/mirrored-bed

die() {
  echo "cluster_bed: $*" >&2
  exit 1
}

bed() {
  [[ "${MIRRORED_BED:-}" =~ ^mbed[0-9a-f]{4}$ ]] || die "MIRRORED_BED is not set to a bed (mbed + 4 hex digits; 'up' prints one)"
  echo "${MIRRORED_BED}"
}

host_index() {
  [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -lt 200 ] || die "bad host index '$1'"
  [ -e "/run/netns/$(bed)-h$1" ] || die "host $1 is not in bed $(bed)"
  echo "$1"
}

check() {
  local why=""
  [ "$(id -u)" -eq 0 ] || why="needs root (network namespaces)"
  local tool
  for tool in ip tc nft unshare nsenter; do
    [ -n "$why" ] || command -v "$tool" >/dev/null 2>&1 || why="needs '$tool' (iproute2, nftables, util-linux)"
  done
  if [ -z "$why" ]; then
    local probe="mbedprobe$$"
    if ! ip netns add "$probe" 2>/dev/null; then
      why="cannot make a network namespace here (a container without CAP_SYS_ADMIN?)"
    else
      ip netns exec "$probe" nft list tables >/dev/null 2>&1 || why="nftables does not work in a namespace here"
      ip netns del "$probe"
    fi
  fi
  if [ -n "$why" ]; then
    echo "cluster_bed: no bed on this machine: $why"
    exit 77
  fi
}

up() {
  local k=$1
  [[ "$k" =~ ^[0-9]+$ ]] && [ "$k" -ge 1 ] && [ "$k" -le 200 ] || die "up: K must be 1..200"
  local prefix="mbed$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')"
  export MIRRORED_BED=$prefix
  mkdir -p "$STATE/$prefix"
  echo "${MIRRORED_BED_OWNER:-$PPID}" > "$STATE/$prefix/owner"
  ip netns add "$prefix-sw"
  ip -n "$prefix-sw" link add br0 type bridge
  ip -n "$prefix-sw" link set br0 up
  ip -n "$prefix-sw" link set lo up
  local h
  for ((h = 0; h < k; h++)); do
    local ns="$prefix-h$h"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # The pair is made inside the switch's namespace and one end moved: no name ever exists in
    # the machine's own namespace.
    ip -n "$prefix-sw" link add "p$h" type veth peer name "e$h"
    ip -n "$prefix-sw" link set "e$h" netns "$ns"
    ip -n "$ns" link set "e$h" name eth0
    ip -n "$ns" addr add "$SUBNET.$((10 + h))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$prefix-sw" link set "p$h" master br0
    ip -n "$prefix-sw" link set "p$h" up
    # Own shared memory and host name, kept by bind-mounted namespace files. The host name is the
    # address: the bed has no name service, and launchers pass host names around (torchrun's
    # MASTER_ADDR is its first agent's host name).
    touch "$STATE/$prefix/h$h.ipc" "$STATE/$prefix/h$h.uts"
    unshare --ipc="$STATE/$prefix/h$h.ipc" --uts="$STATE/$prefix/h$h.uts" hostname "$SUBNET.$((10 + h))"
  done
  echo "$prefix"
}

run_on() {
  local h
  h=$(host_index "$1")
  shift
  local p
  p=$(bed)
  exec nsenter --net="/run/netns/$p-h$h" --ipc="$STATE/$p/h$h.ipc" --uts="$STATE/$p/h$h.uts" -- "$@"
}

cap() {
  local h
  h=$(host_index "$1")
  local rate=$2
  uncap "$h"
  # Out of the host, and out of its switch port (into the host). The small latency bound keeps
  # the queue short, as a switch's is.
  ip netns exec "$(bed)-h$h" tc qdisc add dev eth0 root tbf rate "$rate" burst 32kbit latency 50ms
  ip netns exec "$(bed)-sw" tc qdisc add dev "p$h" root tbf rate "$rate" burst 32kbit latency 50ms
}

uncap() {
  local h
  h=$(host_index "$1")
  ip netns exec "$(bed)-h$h" tc qdisc del dev eth0 root 2>/dev/null || true
  ip netns exec "$(bed)-sw" tc qdisc del dev "p$h" root 2>/dev/null || true
}

partition() {
  local h
  h=$(host_index "$1")
  local how=$2 rules=""
  case "$how" in
    both) rules="chain in { type filter hook input priority 0; iifname \"eth0\" drop; }
                 chain out { type filter hook output priority 0; oifname \"eth0\" drop; }" ;;
    in) rules="chain in { type filter hook input priority 0; iifname \"eth0\" drop; }" ;;
    out) rules="chain out { type filter hook output priority 0; oifname \"eth0\" drop; }" ;;
    *) die "partition: both, in or out, not '$how'" ;;
  esac
  heal "$h"
  ip netns exec "$(bed)-h$h" nft -f - <<EOF
table inet mirrored_bed {
  $rules
}
EOF
}

cut() {
  local h g
  h=$(host_index "$1")
  g=$(host_index "$2")
  heal "$h"
  ip netns exec "$(bed)-h$h" nft -f - <<EOF
table inet mirrored_bed {
  chain in { type filter hook input priority 0; ip saddr $SUBNET.$((10 + g)) drop; }
  chain out { type filter hook output priority 0; ip daddr $SUBNET.$((10 + g)) drop; }
}
EOF
}

heal() {
  local h
  h=$(host_index "$1")
  ip netns exec "$(bed)-h$h" nft delete table inet mirrored_bed 2>/dev/null || true
}

link() {
  local h
  h=$(host_index "$1")
  case "$2" in
    up | down) ip -n "$(bed)-sw" link set "p$h" "$2" ;;
    *) die "link: up or down, not '$2'" ;;
  esac
}

# Removes bed $1: kills what runs on its hosts, deletes its namespaces and namespace files.
remove() {
  local p=$1 ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$p-(sw|h[0-9]+)$" || true); do
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  if [ -d "$STATE/$p" ]; then
    local f
    for f in "$STATE/$p"/*; do
      [ -e "$f" ] || continue
      umount "$f" 2>/dev/null || true
      rm -f "$f"
    done
    rmdir "$STATE/$p" 2>/dev/null || true
  fi
}

clean() {
  local p owner
  for p in $( (ip netns list | awk '{print $1}' | sed -nE 's/^(mbed[0-9a-f]{4})-(sw|h[0-9]+)$/\1/p'
    ls "$STATE" 2>/dev/null | grep -E '^mbed[0-9a-f]{4}$') | sort -u); do
    owner=$(cat "$STATE/$p/owner" 2>/dev/null || true)
    if [ "${1:-}" != --all ] && [[ "$owner" =~ ^[0-9]+$ ]] && kill -0 "$owner" 2>/dev/null; then continue; fi
    remove "$p"
  done
}

[ $# -ge 1 ] || die "usage: see the comment at the top of $0"
cmd=$1
shift
case "$cmd" in
  check) check ;;
  up) [ $# -eq 1 ] || die "usage: up K"; up "$1" ;;
  addr) [ $# -eq 1 ] || die "usage: addr H"; echo "$SUBNET.$((10 + $(host_index "$1")))" ;;
  run) [ $# -ge 2 ] || die "usage: run H CMD [ARG...]"; run_on "$@" ;;
  cap) [ $# -eq 2 ] || die "usage: cap H RATE"; cap "$1" "$2" ;;
  uncap) [ $# -eq 1 ] || die "usage: uncap H"; uncap "$1" ;;
  partition) [ $# -eq 2 ] || die "usage: partition H both|in|out"; partition "$1" "$2" ;;
  cut) [ $# -eq 2 ] || die "usage: cut H G"; cut "$1" "$2" ;;
  heal) [ $# -eq 1 ] || die "usage: heal H"; heal "$1" ;;
  link) [ $# -eq 2 ] || die "usage: link H down|up"; link "$1" "$2" ;;
  down) remove "$(bed)" ;;
  clean) clean "$@" ;;
  *) die "unknown command '$cmd'" ;;
esac
