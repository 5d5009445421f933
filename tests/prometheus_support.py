"""A REAL Prometheus (the Debian package's binary, installed by scripts/setup.sh) run by the tests on
127.0.0.1: its own config and data directory, an ephemeral port, stopped by its PID. Never the
Debian service.

    with PrometheusServer(tmp_path, [Target("127.0.0.1:8000", "/metrics", {"pdops_dev_colour": "blue"})]) as p:
        p.url   # http://127.0.0.1:PORT
"""
from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass
class Target:
    address: str                                   # host:port
    path: str = "/metrics"
    labels: dict[str, str] = field(default_factory=dict)   # target labels, as a PodMonitor's relabelling sets them


def binary() -> str | None:
    return shutil.which("prometheus")


def version() -> str:
    out = subprocess.run([binary() or "prometheus", "--version"], capture_output=True, text=True, check=True)
    return (out.stdout or out.stderr).splitlines()[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusServer:
    def __init__(self, workdir: Path, targets: list[Target], scrape_interval: str = "1s",
                 metric_relabel_configs: list[dict] | None = None):
        self.workdir, self.port = Path(workdir), _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval},
                  "scrape_configs": [{"job_name": "engines", "static_configs": [
                      {"targets": [t.address], "labels": {"__metrics_path__": t.path, **t.labels}} for t in targets]}]}
        if metric_relabel_configs:
            config["scrape_configs"][0]["metric_relabel_configs"] = metric_relabel_configs
        self.config = self.workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.targets = len(targets)
        assert scrape_interval.endswith("s") and not scrape_interval.endswith("ms"), "seconds, e.g. 1s"
        self.interval_s = float(scrape_interval[:-1])
        self.proc: subprocess.Popen | None = None

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            return json.loads(r.read())

    def start(self, timeout_s: float = 60.0) -> PrometheusServer:
        log = open(self.workdir / "prometheus.log", "wb")   # noqa: SIM115 - kept open for the process
        self.proc = subprocess.Popen(
            [binary() or "prometheus", f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while True:   # every target scraped at least twice: increase() has two samples from then on
            try:
                active = self._get("/api/v1/targets")["data"]["activeTargets"]
                if len(active) == self.targets and all(t["health"] == "up" for t in active):
                    time.sleep(2.2 * self.interval_s)
                    return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not scrape its targets: {(self.workdir / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
