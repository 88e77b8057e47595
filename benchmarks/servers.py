"""Servers for the serving benchmarks (serve_load.py, serve_peers.py): a free port, bertforge's
server started from a source tree, and the cross-encoder both benchmarks rerank with."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cross_encoder(minilm: Path, out: Path) -> Path:
    """all-MiniLM-L6-v2 with a fresh one-output sequence head (seeded): a cross-encoder whose
    /embed is all-MiniLM-L6-v2's (its sentence-transformers files are kept)."""
    import shutil
    import warnings

    import torch

    from bertforge.heads import BertForSequenceClassification

    shutil.copytree(minilm, out)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fresh head
        BertForSequenceClassification.from_pretrained(minilm, num_labels=1).save_pretrained(out)
    return out


def start(model: str, src: str | None, options: str = "") -> tuple[subprocess.Popen, str]:
    """The server on a free port (from source tree `src` when given; with more `serve`
    options), once it answers."""
    import os
    import shlex

    import httpx

    port = free_port()
    env = {**os.environ, **({"PYTHONPATH": src} if src else {})}
    cmd = [sys.executable, "-m", "bertforge", "serve", model, "--port", str(port)]
    cmd += shlex.split(options)
    proc = subprocess.Popen(cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    return proc, url
