#!/usr/bin/env bash
# Several "hosts" on one machine, for multi-node tests (needs root):
#
#   netns_hosts.sh up NAME COUNT SUBNET     # e.g. up drmn 2 10.77.31
#   netns_hosts.sh cut|mend NAME I          # unplug or replug host I's cable
#   netns_hosts.sh down NAME COUNT          # safe to repeat
#
# up makes network namespaces NAME1..NAMECOUNT, host I at SUBNET.(10+I), and
# gives this namespace SUBNET.1, all plugged into one bridge that lives in a
# namespace of its own (NAMEsw): the bridge's traffic never meets this
# machine's firewall, and nothing outside the test can reach the hosts.
set -euo pipefail
action=$1
name=$2

down() {
  local count=$1
  for ((i = 1; i <= count; i++)); do ip netns del "$name$i" 2>/dev/null || true; done
  ip netns del "${name}sw" 2>/dev/null || true  # takes the bridge and the veths along
  ip link del "${name}c" 2>/dev/null || true
}

case $action in
up)
  count=$3
  subnet=$4
  down "$count"
  ip netns add "${name}sw"
  ip -n "${name}sw" link add br0 type bridge
  ip -n "${name}sw" link set br0 up
  ip link add "${name}c" type veth peer name c netns "${name}sw"
  ip -n "${name}sw" link set c master br0 up
  ip addr add "$subnet.1/24" dev "${name}c"
  ip link set "${name}c" up
  for ((i = 1; i <= count; i++)); do
    ip netns add "$name$i"
    ip -n "${name}sw" link add "n$i" type veth peer name eth0 netns "$name$i"
    ip -n "${name}sw" link set "n$i" master br0 up
    ip -n "$name$i" link set lo up
    ip -n "$name$i" addr add "$subnet.$((10 + i))/24" dev eth0
    ip -n "$name$i" link set eth0 up
  done
  ;;
cut) ip -n "${name}sw" link set "n$3" down ;;
mend) ip -n "${name}sw" link set "n$3" up ;;
down) down "$3" ;;
*)
  echo "usage: $0 up NAME COUNT SUBNET | cut NAME I | mend NAME I | down NAME COUNT" >&2
  exit 2
  ;;
esac
