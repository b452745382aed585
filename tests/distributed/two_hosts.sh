#!/usr/bin/env bash
# Runs a test binary under mpirun on two "hosts": two Linux network namespaces joined by a veth
# pair, so that the ranks talk over OpenMPI's TCP transport between two IP addresses, as between
# two machines (nothing goes through loopback). mpirun starts the remote daemon through an rsh
# agent that enters the other namespace instead of ssh.
#   tests/distributed/two_hosts.sh BINARY [ARGS...]
# Needs root (ip netns) and iproute2. Without them it says why and exits 77 (CTest's skip code).
set -euo pipefail
binary=${1:?usage: tests/distributed/two_hosts.sh BINARY [ARGS...]}
shift
skip() {
  echo "two_hosts: skipped: $1"
  exit 77
}
[ "$(id -u)" = 0 ] && command -v ip >/dev/null || skip "network namespaces need root and iproute2"
ns1=tf_host1_$$ ns2=tf_host2_$$ ip1=10.231.$(($$ % 200)).1 ip2=10.231.$(($$ % 200)).2
work=$(mktemp -d)
cleanup() {
  ip netns del "$ns1" 2>/dev/null || true
  ip netns del "$ns2" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# Setting up the two hosts may be refused (a container without CAP_NET_ADMIN): a skip, not a
# failure; what is tested is the run.
{
  ip netns add "$ns1" && ip netns add "$ns2" &&
    ip link add tfv1_$$ netns "$ns1" type veth peer name tfv2_$$ netns "$ns2" &&
    ip -n "$ns1" addr add "$ip1/24" dev tfv1_$$ && ip -n "$ns2" addr add "$ip2/24" dev tfv2_$$ &&
    ip -n "$ns1" link set lo up && ip -n "$ns2" link set lo up &&
    ip -n "$ns1" link set tfv1_$$ up && ip -n "$ns2" link set tfv2_$$ up
} 2>"$work/setup.err" || skip "could not make two network namespaces: $(head -1 "$work/setup.err")"
# The rsh agent: "agent HOST COMMAND..." runs COMMAND inside HOST's namespace.
cat >"$work/agent" <<EOF
#!/bin/sh
host=\$1
shift
case "\$host" in
  $ip1) ns=$ns1 ;;
  $ip2) ns=$ns2 ;;
  *) echo "two_hosts agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" sh -c "\$*"
EOF
chmod +x "$work/agent"
export_env=(-x PATH)
[ -n "${ASAN_OPTIONS:-}" ] && export_env+=(-x ASAN_OPTIONS)
echo "two_hosts: $ns1 ($ip1) and $ns2 ($ip2), veth, OpenMPI TCP"
ip netns exec "$ns1" mpirun --allow-run-as-root -np 2 --host "$ip1:1,$ip2:1" \
  --mca plm_rsh_agent "$work/agent" --mca btl self,tcp \
  --mca btl_tcp_if_include "$ip1/24" --mca oob_tcp_if_include "$ip1/24" \
  "${export_env[@]}" "$binary" "$@"
