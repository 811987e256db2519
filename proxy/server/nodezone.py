"""``kafka-fetch-proxy node-zone``: write the zone of the node a pod runs on to a file.

Kubernetes puts a node's zone in its ``topology.kubernetes.io/zone`` label, but the
downward API exposes only the pod's own fields and labels, not its node's (except
behind the alpha/beta PodTopologyLabelsAdmission gate of recent releases).  So the
Kubernetes example runs this command once, as an init container of the proxy's own
image, before the proxy starts: it reads ``spec.nodeName`` (``$NODE_NAME``, from the
downward API), GETs ``/api/v1/nodes/NODE`` from the API server with the pod's
service-account token, and writes the label's value to ``--output`` (an emptyDir the
proxy reads through its ``rack_file`` setting).  The service account needs ``get`` on
``nodes`` (a ClusterRole: nodes are cluster-scoped); deploy/kubernetes/rbac.yaml.

A node without the label gets an empty file (the proxy runs with rack-aware fetching
off) unless ``--require``.  Exit codes: 0 written, 1 the API or the file failed (the
kubelet restarts the init container with back-off), 2 usage.  Standard library only,
no trio: a one-shot command, not part of the proxy's event loop.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config import rack_problem

ZONE_LABEL = "topology.kubernetes.io/zone"
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
NODE_ENV = "NODE_NAME"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "node-zone",
        help="write this pod's node zone to a file (an init container's job)",
        description="Read the zone label of the node this pod runs on from the Kubernetes "
        "API (service-account token; RBAC: get nodes) and write it to a file for the "
        "proxy's rack_file setting.",
    )
    parser.add_argument("--output", required=True, metavar="PATH", help="file to write")
    parser.add_argument(
        "--node", metavar="NAME", help=f"node name (default: ${NODE_ENV}, spec.nodeName)"
    )
    parser.add_argument("--label", default=ZONE_LABEL, help=f"node label (default: {ZONE_LABEL})")
    parser.add_argument(
        "--api-server",
        metavar="URL",
        help="default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT",
    )
    parser.add_argument("--token-file", metavar="PATH", default=f"{SERVICE_ACCOUNT}/token")
    parser.add_argument("--ca-file", metavar="PATH", default=f"{SERVICE_ACCOUNT}/ca.crt")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS")
    parser.add_argument(
        "--require",
        action="store_true",
        help="fail when the node has no such label (default: write an empty file, rack off)",
    )
    parser.set_defaults(func=run)


def api_server(environ: Mapping[str, str]) -> str | None:
    """The in-cluster API server's URL, from the variables every pod gets."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def node_zone(
    server: str, node: str, label: str, token: str, ca_file: str | None, timeout: float
) -> str | None:
    """The node's *label* value (None: no such label); OSError/ValueError on failure."""
    url = f"{server.rstrip('/')}/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"}
    )
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https:") else None
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        body = json.loads(response.read(4 << 20))
    labels = (body.get("metadata") or {}).get("labels") or {}
    value = labels.get(label)
    return None if value is None else str(value)


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    node = args.node or environ.get(NODE_ENV)
    server = args.api_server or api_server(environ)
    if not node or not server:
        missing = "node name (--node or $NODE_NAME)" if not node else "API server (--api-server)"
        print(f"kafka-fetch-proxy node-zone: no {missing}", file=sys.stderr)
        return 2
    try:
        token = Path(args.token_file).read_text().strip()
        zone = node_zone(server, node, args.label, token, args.ca_file, args.timeout)
    except urllib.error.HTTPError as exc:
        hint = (
            "; the pod's service account needs get on nodes (deploy/kubernetes/rbac.yaml)"
            if exc.code in (401, 403)
            else ""
        )
        print(
            f"kafka-fetch-proxy node-zone: GET node {node}: HTTP {exc.code}{hint}", file=sys.stderr
        )
        return 1
    except (OSError, ValueError) as exc:  # URLError, TLS, timeout, token file, bad JSON
        print(f"kafka-fetch-proxy node-zone: GET node {node}: {exc}", file=sys.stderr)
        return 1
    if zone is None:
        if args.require:
            print(
                f"kafka-fetch-proxy node-zone: node {node} has no label {args.label}",
                file=sys.stderr,
            )
            return 1
        print(
            f"kafka-fetch-proxy node-zone: node {node} has no label {args.label};"
            " writing an empty rack (rack-aware fetching off)",
            file=sys.stderr,
        )
        zone = ""
    problem = rack_problem(zone)
    if problem is not None:
        print(
            f"kafka-fetch-proxy node-zone: label {args.label} of node {node} is {zone!r},"
            f" not a rack name ({problem})",
            file=sys.stderr,
        )
        return 1
    output = Path(args.output)
    try:
        partial = output.with_name(output.name + ".partial")
        partial.write_text(zone)
        partial.replace(output)  # the proxy never reads half a file
    except OSError as exc:
        print(f"kafka-fetch-proxy node-zone: cannot write {output}: {exc}", file=sys.stderr)
        return 1
    print(f"zone={zone}", flush=True)
    return 0
