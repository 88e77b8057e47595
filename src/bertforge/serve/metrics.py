"""GET /metrics: requests by endpoint and status, their latency, texts per model call and the
queue's depth, counted as they happen and written as Prometheus text (version 0.0.4)."""

from __future__ import annotations


class Metrics:
    """Counters and histograms for GET /metrics (Prometheus text format, version 0.0.4)."""

    LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
    BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.latency: dict[str, list[float]] = {}  # per endpoint: bucket counts, then sum
        self.batches: list[float] = [0.0] * (len(self.BATCH) + 2)
        self.queue_depth = 0

    @staticmethod
    def _observe(counts: list[float], buckets: tuple[float, ...], value: float) -> None:
        for k, edge in enumerate(buckets):
            counts[k] += value <= edge
        counts[-2] += 1  # +Inf (= count)
        counts[-1] += value  # sum

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests[endpoint, status] = self.requests.get((endpoint, status), 0) + 1
        counts = self.latency.setdefault(endpoint, [0.0] * (len(self.LATENCY) + 2))
        self._observe(counts, self.LATENCY, seconds)

    def batch(self, texts: int, waiting: int) -> None:
        self._observe(self.batches, self.BATCH, texts)
        self.queue_depth = waiting

    def text(self) -> str:
        out = _header("requests_total", "counter", "HTTP requests by endpoint and status.")
        out += [
            f'bertforge_requests_total{{endpoint="{e}",status="{s}"}} {n}'
            for (e, s), n in sorted(self.requests.items())
        ]
        out += _header("request_seconds", "histogram", "Request latency.")
        for e, counts in sorted(self.latency.items()):
            out += _histogram("bertforge_request_seconds", f'endpoint="{e}",', self.LATENCY, counts)
        out += _header("batch_texts", "histogram", "Texts per model call.")
        out += _histogram("bertforge_batch_texts", "", self.BATCH, self.batches)
        out += _header("queue_depth", "gauge", "Requests waiting after the last batch was formed.")
        out.append(f"bertforge_queue_depth {self.queue_depth}")
        return "\n".join(out) + "\n"


def _header(name: str, kind: str, text: str) -> list[str]:
    """The HELP and TYPE lines of the metric bertforge_<name>."""
    return [f"# HELP bertforge_{name} {text}", f"# TYPE bertforge_{name} {kind}"]


def _histogram(
    name: str, labels: str, buckets: tuple[float, ...], counts: list[float]
) -> list[str]:
    lines = [
        f'{name}_bucket{{{labels}le="{edge:g}"}} {counts[k]:g}' for k, edge in enumerate(buckets)
    ]
    lines.append(f'{name}_bucket{{{labels}le="+Inf"}} {counts[-2]:g}')
    braces = f"{{{labels.rstrip(',')}}}" if labels else ""
    return [*lines, f"{name}_sum{braces} {counts[-1]:g}", f"{name}_count{braces} {counts[-2]:g}"]
