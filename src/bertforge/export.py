"""`bertforge export MODEL --onnx FILE`: the model as an ONNX graph, checked with onnxruntime.

The graph takes input_ids, token_type_ids, attention_mask (int64, batch x sequence, both axes
dynamic) and returns the outputs the catalogue gives the checkpoint's head (catalogue.py,
`onnx`): logits for sequence or token classification, start_logits and end_logits for QA,
last_hidden_state and pooler_output for an encoder (or a pre-training checkpoint). After
export, onnxruntime runs a batch of a different size and length than the one traced, and the
largest difference to PyTorch must be within `atol` (1e-4), else the file is not kept. Needs
the `onnx` extra (onnx, onnxscript, onnxruntime).

`sentence_embedding` adds the output people export a sentence-transformers model for:
sentence_embedding (batch x D), the rows' token states pooled and normalised as the directory
says (bertforge.embedding's `settings` and `pool`, every mode; its Normalize), what
`SentenceTransformer(MODEL).encode` gives for the same rows, however they are padded. It is
on by default for a sentence-transformers directory (modules.json): the directory declares its
pooling, so the graph should carry it, and the encoder's outputs stay (a consumer reading them
by name or position is unchanged); `--sentence-embedding` asks for it elsewhere (a plain BERT:
mean pooling, not normalised, as `bertforge embed`; a checkpoint with a head: its encoder),
`--no-sentence-embedding` leaves it out. A Pooling with include_prompt: false gets none (asked
for, an error): the graph sees token ids, and cannot tell a prompt's tokens from the text's.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from . import embedding
from .catalogue import ENTRIES
from .errors import ConfigError, need_extra
from .fileio import atomic_path
from .modeldir import ModelDir
from .tokenizer import Tokenizer

INPUTS = ["input_ids", "token_type_ids", "attention_mask"]


class _Graph(nn.Module):
    """The model with positional inputs and a tuple of tensors out (what export traces); with
    `pooled` settings, its last output is their sentence embedding."""

    def __init__(
        self, model: nn.Module, outputs: list[str], pooled: embedding.Embedding | None = None
    ) -> None:
        super().__init__()
        self.model, self.outputs, self.pooled = model, outputs, pooled

    def forward(self, input_ids: Any, token_type_ids: Any, attention_mask: Any) -> tuple:
        out = self.model(input_ids, token_type_ids, attention_mask)
        found = tuple(getattr(out, name) for name in self.outputs if name != "sentence_embedding")
        if self.pooled is None:
            return found
        vectors = embedding.pool(out.last_hidden_state, attention_mask, self.pooled.pooling)
        if self.pooled.normalize:  # (B, D); eps as sentence-transformers' Normalize
            vectors = nn.functional.normalize(vectors, p=2.0, dim=-1, eps=1e-12)
        return (*found, vectors)


def _sentence_settings(
    model_dir: Path | ModelDir, entry_name: str, asked: bool | None
) -> embedding.Embedding | None:
    """The pooling the graph carries (see the module docstring), or None for none."""
    wanted = asked if asked is not None else (model_dir / "modules.json").is_file()
    if not wanted or (asked is None and entry_name != "embed"):
        return None
    own = ModelDir.open(model_dir).embedding
    if own.include_prompt:
        return own
    why = (
        f"{own.source}: its Pooling leaves prompts out (include_prompt: false), which a graph "
        "of token ids cannot do"
    )
    if asked:
        raise ConfigError(f"{why}: export without --sentence-embedding")
    warnings.warn(f"{why}: no sentence_embedding output", stacklevel=3)
    return None


def export_onnx(
    model_dir: str | os.PathLike[str] | ModelDir,
    out: str | os.PathLike[str],
    atol: float = 1e-4,
    sentence_embedding: bool | None = None,
) -> dict[str, Any]:
    """Export and check; returns {"outputs": [...], "max_abs_diff": {...}}. sentence_embedding:
    the pooled output (None: for a sentence-transformers directory; see the module docstring)."""
    onnxruntime = need_extra(
        "onnxruntime", "ONNX export needs: pip install onnx onnxscript onnxruntime"
    )
    if not atol > 0:
        raise ConfigError(f"atol={atol} (--atol): must be > 0")
    source = ModelDir.open(
        model_dir
    )  # a hub name: its snapshot, whose modules.json says the pooling
    model_dir = source.path
    # the first pipeline of the catalogue with a graph for this checkpoint's head, else the encoder
    found = source.architectures
    entry = next(
        (e for e in ENTRIES.values() if e.onnx and e.needs and e.available(found)), ENTRIES["embed"]
    )
    pooled = _sentence_settings(source, entry.name, sentence_embedding)
    if pooled is not None:
        entry = ENTRIES["embed"]
    with source.reading():
        model = entry.model.from_pretrained(model_dir).eval()
    outputs = [o for o in entry.onnx if o != "pooler_output" or model.pooler is not None]
    outputs += ["sentence_embedding"] if pooled is not None else []
    tok = source.tokenizer
    graph = _Graph(model, outputs, pooled).eval()
    traced = tok(["a short example", "a second, longer example sentence for tracing"])
    batch, seq = (
        torch.export.Dim("batch"),
        torch.export.Dim("sequence", max=model.config.max_tokens),
    )
    out = Path(out)
    with atomic_path(out) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph,
            tuple(traced[k] for k in INPUTS),
            str(tmp),
            input_names=INPUTS,
            output_names=outputs,
            dynamic_shapes=tuple({0: batch, 1: seq} for _ in INPUTS),
            dynamo=True,
            verbose=False,
            external_data=False,  # one self-contained file
        )
        session = onnxruntime.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        diffs = _differences(session, graph, tok, outputs)
        worst = max(diffs.values())
        if not worst <= atol:
            raise ConfigError(f"{out}: onnxruntime differs from PyTorch by {worst:.2e} (> {atol})")
    arch = entry.model.hf_architecture
    return {"architecture": arch, "outputs": outputs, "max_abs_diff": diffs}


def _differences(session: Any, graph: nn.Module, tok: Tokenizer, outputs: list[str]) -> dict:
    """Each output's max |onnxruntime - PyTorch| on a batch of another size and length than
    the one traced."""
    check = tok(
        [
            "x",
            "a different batch: three inputs, and one much longer than the others "
            "so that the sequence axis changes too",
            "third",
        ]
    )
    got = session.run(outputs, {k: check[k].numpy() for k in INPUTS})
    with torch.no_grad():
        want = graph(*(check[k] for k in INPUTS))
    return {n: float(np.abs(g - w.numpy()).max()) for n, g, w in zip(outputs, got, want)}
