"""`python -m tests.fakes.kube --kubeconfig FILE [--hosts FILE]`: serve a test cluster until SIGTERM/SIGINT."""
from __future__ import annotations

import argparse
import signal
import threading

from tests.fakes.kube import start_cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--hosts", help="keep this file updated with /etc/hosts lines for every Service")
    args = parser.parse_args()
    cluster = start_cluster(kubeconfig=args.kubeconfig)
    print(f"test cluster at {cluster.url}; kubeconfig {cluster.kubeconfig}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        if args.hosts:
            with open(args.hosts, "w", encoding="utf-8") as f:
                f.write("127.0.0.1 localhost\n" + cluster.hosts())
    cluster.close()


if __name__ == "__main__":
    main()
