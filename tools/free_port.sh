# shellcheck shell=bash
# Sourced by tools/launch.sh and bench/bench_multi_worker.sh:
#
#   free_port HOST [TAKEN...]   prints a port on HOST that nobody listens on and is not in TAKEN
#
# The port is chosen below the kernel's ephemeral range (ip_local_port_range) when there is room.
# The kernel hands out ports in that range to outgoing connections and to binds of port 0, so any
# connection on the machine (another job's, another test's) could take such a port between this
# pick and the later bind, which then fails with EADDRINUSE. Below the range only a listener can
# take it, and the probe (a connection attempt) sees listeners.
free_port() {
  local host="$1" p tries lo=10000 hi=59999 eph_lo eph_hi t
  shift
  if read -r eph_lo eph_hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null; then
    if ((eph_lo - 1 - 10000 >= 2000)); then
      hi=$((eph_lo - 1))
    elif ((65535 - eph_hi - 1 >= 2000)); then
      lo=$((eph_hi + 1))
      hi=65535
    fi
  fi
  for ((tries = 0; tries < 200; tries++)); do
    p=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo + 1)))
    for t in "$@"; do [ "$t" = "$p" ] && continue 2; done
    if ! (exec 3<>"/dev/tcp/$host/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  echo "free_port: found no free port on $host between $lo and $hi" >&2
  return 1
}
