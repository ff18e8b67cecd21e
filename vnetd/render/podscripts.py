"""The shell scripts the rendered containers run at start.

* ``readyz_wait``: bash that polls this pod's vnetd ``/readyz`` (bash's
  ``/dev/tcp``, so the Flux image needs neither curl nor Python), bounded,
  and exits 1 naming the port when it never answers 200. The Job's Flux
  container runs it before ``flux broker``; a MiniCluster runs it as
  ``commands.pre``, since the Flux Operator's containers have no startup
  gate of their own.
* ``mesh_gate_wait``: bash a MiniCluster's Flux container runs after that
  wait, polling vnetd's ``/gatez`` until the ranks its broker connects to
  answer over the overlay; it exits 1 with vnetd doctor's verdict for those
  that did not when its bound expires, and at once when vnetd names a foreign
  sidecar in the pod.
* ``flux_start_script``: that wait, then ``exec flux broker`` with the
  rendered bootstrap config.
* ``CERT_COPY_SCRIPT``: flux-core refuses a CURVE certificate its group or
  others can read, and a Secret volume is root-owned; an init container of
  the Flux image (so the same user as the broker) copies it into an
  ``emptyDir`` as a 0400 file of its own.
* ``SIGNING_KEY_SCRIPT``: a pinned gateway's record signing key, from the
  Secret that holds the site's pinned keys, into its pod's state dir as
  ``signing.key`` (0600), so a rescheduled gateway signs with the pinned key
  again; in any other pod it copies nothing. Only this init container mounts
  the Secret, so no other pod's containers can read a gateway's key.
* ``UNDERLAY_SCRIPT``: the DaemonSet's entrypoint. With
  ``VNETD_UNDERLAY_INTERFACE`` set it takes that interface's first global
  address as ``POD_IP`` (the endpoint peers send to, and the underlay
  ``mtu = "auto"`` reads), then execs vnetd with the container's args.

Every script here is run in the netns lab by ``tests/e2e/test_k8s_entrypoints.py``.
"""

from __future__ import annotations

import shlex

READY_TIMEOUT = 300
"""Seconds a Flux container waits for ``/readyz``: the sidecar's startup probe's bound."""

CURVE_SECRET_DIR = "/etc/flux/curve-secret"
"""Where the CURVE certificate Secret is mounted, in the copying init container only."""

UNDERLAY_ENV = "VNETD_UNDERLAY_INTERFACE"

CERT_COPY_SCRIPT = 'set -eu\numask 077\nrm -f "$2"\ncp "$1" "$2"\nchmod 0400 "$2"\n'
"""``sh -c CERT_COPY_SCRIPT copy-curve-cert SOURCE TARGET``."""

UNDERLAY_SCRIPT = f"""\
set -euf
if [ -n "${{{UNDERLAY_ENV}:-}}" ]; then
  address_of() {{ [ "$#" -ge 4 ] && printf '%s\\n' "${{4%/*}}"; }}
  line=$(ip -o addr show dev "${UNDERLAY_ENV}" scope global | head -n 1)
  POD_IP=$(address_of $line) || {{
    echo "{UNDERLAY_ENV}: ${UNDERLAY_ENV} has no global address on this node;" \\
      "name an interface that has one, or leave it empty for POD_IP" >&2
    exit 2
  }}
  export POD_IP
  echo "underlay: ${UNDERLAY_ENV} $POD_IP"
fi
exec vnetd "$@"
"""


SIGNING_KEY_SCRIPT = """\
set -eu
source="$1/gateway-$2.key"
if [ ! -e "$source" ]; then
  echo "signing key: none in the Secret for rank $2 (not a pinned gateway of this site)"
  exit 0
fi
umask 077
mkdir -p "$3"
chmod 0700 "$3"
cat "$source" > "$3/signing.key.new"
mv -f "$3/signing.key.new" "$3/signing.key"
echo "signing key: rank $2's pinned key from the Secret, into $3/signing.key"
"""
"""``sh -c SIGNING_KEY_SCRIPT signing-key SECRET_DIR RANK STATE_DIR``."""

FORWARDING_SCRIPT = """\
set -eu
read -r host < /proc/sys/kernel/hostname
versions=$1
shift
for gateway in "$@"; do
  if [ "$host" = "$gateway" ]; then
    case " $versions " in *" 4 "*)
      echo 1 > /proc/sys/net/ipv4/ip_forward
      echo 0 > /proc/sys/net/ipv4/conf/all/send_redirects ;;
    esac
    case " $versions " in *" 6 "*)
      echo 1 > /proc/sys/net/ipv6/conf/all/forwarding ;;
    esac
    echo "forwarding: on, IP versions $versions ($host is a gateway of this site)"
    exit 0
  fi
done
echo "forwarding: unchanged ($host is not a gateway of this site)"
"""
"""``sh -c FORWARDING_SCRIPT forwarding "4 6" GATEWAY_HOST...``: the pod's own netns only."""


def readyz_wait(host: str, port: int, timeout: int = READY_TIMEOUT) -> str:
    """Bash that returns once ``http://host:port/readyz`` answers 200, or exits 1.

    ``host`` is a literal address (``127.0.0.1`` or ``::1``): the pod's own vnetd.
    """
    return f"""\
# Wait for this pod's vnetd: /readyz answers 200 once the rank's overlay
# address is on the interface and the rank is claimed.
vnetd_ready() {{
  (
    exec 3<>"/dev/tcp/{host}/{port}" || exit 1
    printf 'GET /readyz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3
    IFS=' ' read -r -t 5 _ status _ <&3 || exit 1
    [ "$status" = 200 ]
  ) 2>/dev/null
}}
vnetd_deadline=$((SECONDS + {timeout}))
until vnetd_ready; do
  if [ "$SECONDS" -ge "$vnetd_deadline" ]; then
    echo "vnetd did not answer 200 on /readyz (port {port}) within {timeout} s" >&2
    exit 1
  fi
  sleep 1
done
echo "vnetd ready: the overlay address is up"
"""


GATE_TIMEOUT = 600
"""Seconds a MiniCluster's Flux container waits at the mesh gate (``mesh_gate_wait``): its
peers' pods may still be pulling images when its own vnetd is ready."""
GATE_READ = 20
"""Seconds the gate's script waits for an answer: the verdict probes for up to 10 s."""
GATE_REPORT = 30
"""Seconds between two of its progress lines."""


def mesh_gate_wait(host: str, port: int, fanout: int, timeout: int = GATE_TIMEOUT) -> str:
    """Bash that returns once this pod's vnetd answers 200 on ``/gatez`` (the ranks this
    broker connects to in Flux's tree of ``fanout`` are registered and have completed a
    handshake with it: ``vnetd.observe.gate``), or exits 1: at once when vnetd refuses
    (409: a foreign sidecar in the pod), else after ``timeout`` seconds, printing the
    doctor's verdict for the ranks that did not answer to stderr.

    Run after ``readyz_wait`` (so vnetd answers at all); safe under ``set -eu``.
    """
    query = f"fanout={fanout}"
    return f"""\
# The mesh gate: wait until the ranks this broker connects to answer over the overlay.
vnetd_gate() {{
  (
    exec 3<>"/dev/tcp/{host}/{port}" || exit 1
    printf 'GET /gatez?%s HTTP/1.0\r\nHost: localhost\r\n\r\n' "$1" >&3
    IFS=' ' read -r -t {GATE_READ} _ status _ <&3 || exit 1
    while IFS= read -r -t {GATE_READ} line <&3 && [ -n "${{line%$'\r'}}" ]; do :; done
    while IFS= read -r -t {GATE_READ} line <&3 || [ -n "${{line:-}}" ]; do
      printf '%s\n' "$line"; line=
    done
    case "$status" in 200) exit 0 ;; 409) exit 2 ;; *) exit 1 ;; esac
  ) 2>/dev/null
}}
vnetd_gate_start=$SECONDS
vnetd_gate_end=$((SECONDS + {timeout}))
vnetd_gate_report=$SECONDS
while :; do
  vnetd_gate_status=0
  vnetd_gate_says=$(vnetd_gate "{query}") || vnetd_gate_status=$?
  if [ "$vnetd_gate_status" = 0 ]; then
    echo "vnetd gate open: $vnetd_gate_says"
    break
  fi
  if [ "$vnetd_gate_status" = 2 ]; then
    echo "vnetd gate refused: $vnetd_gate_says" >&2
    exit 1
  fi
  if [ "$SECONDS" -ge "$vnetd_gate_end" ]; then
    echo "vnetd gate: timed out after {timeout} s: the ranks this broker connects to" \
      "did not all answer over the overlay; vnetd doctor's verdict:" >&2
    vnetd_gate "{query}&verdict=1" >&2 || true
    exit 1
  fi
  if [ "$SECONDS" -ge "$vnetd_gate_report" ]; then
    echo "vnetd gate: waiting ($((SECONDS - vnetd_gate_start)) s of {timeout} s):" \
      "${{vnetd_gate_says:-no answer}}"
    vnetd_gate_report=$((SECONDS + {GATE_REPORT}))
  fi
  sleep 1
done
"""


def flux_start_script(host: str, port: int, broker_argv: list[str]) -> str:
    """The Job's Flux container: wait for ``/readyz``, then exec the broker."""
    return f"set -euo pipefail\n{readyz_wait(host, port)}exec {shlex.join(broker_argv)}\n"
