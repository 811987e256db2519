"""``python -m proxy.observe.healthcheck``: exit 0 when the proxy's /healthz answers 200.

For container HEALTHCHECKs and exec probes in images without curl.  The endpoint
address comes from ``--address``, else ``KAFKA_FETCH_PROXY_METRICS_LISTEN`` (the
same variable the proxy reads), else ``127.0.0.1:9464``; a wildcard listen host
(0.0.0.0, ::) is checked on loopback.  ``--path /readyz`` checks readiness instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

DEFAULT_ADDRESS = "127.0.0.1:9464"
ENV = "KAFKA_FETCH_PROXY_METRICS_LISTEN"


def url_for(address: str, path: str) -> str:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


def check(url: str, timeout: float) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200, f"{url}: {response.status}"
    except urllib.error.HTTPError as e:
        with e:
            return False, f"{url}: {e.code}"
    except (OSError, ValueError) as e:
        return False, f"{url}: {e}"


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="python -m proxy.observe.healthcheck")
    parser.add_argument("--address", default=env.get(ENV) or DEFAULT_ADDRESS)
    parser.add_argument("--path", default="/healthz", choices=["/healthz", "/readyz"])
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    ok, message = check(url_for(args.address, args.path), args.timeout)
    if not ok:
        print(f"unhealthy: {message}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
