"""Pre-training's two tasks (masked LM, next sentence prediction): their losses, and the
statistics of one batch as `bertforge pretrain` trains and evaluates it.

The heads are heads.BertForPreTraining (masked LM + NSP) and heads.BertForMaskedLM (masked LM
alone, `--no-nsp`); the batches come from data/pretraining.py.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data.instances import IGNORE_INDEX
from ..heads import PreTrainingOutput


class _CrossEntropySum(torch.autograd.Function):
    """Sum of cross-entropies over rows whose label is not IGNORE_INDEX, a few rows at a time.

    F.cross_entropy on (N, V) logits makes several full-size fp32 copies (upcast, log-softmax,
    its gradient); for MLM logits that is hundreds of MB per step. Here each block of rows is
    upcast while it is in cache, and the gradient softmax - onehot is written once, in the
    logits' dtype. Same numbers as F.cross_entropy (fp32 accumulation).
    """

    ROWS = 32

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        valid = labels != IGNORE_INDEX
        safe = labels.masked_fill(~valid, 0)
        lse = torch.empty(len(logits), dtype=torch.float32, device=logits.device)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for i in range(0, len(logits), _CrossEntropySum.ROWS):
            block = logits[i : i + _CrossEntropySum.ROWS].float()
            lse[i : i + len(block)] = torch.logsumexp(block, dim=-1)
            picked = block.gather(1, safe[i : i + len(block), None]).squeeze(1)
            total += ((lse[i : i + len(block)] - picked) * valid[i : i + len(block)]).sum()
        ctx.save_for_backward(logits, safe, valid, lse)
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, safe, valid, lse = ctx.saved_tensors
        out = torch.empty_like(logits)
        rows = torch.arange(_CrossEntropySum.ROWS, device=logits.device)
        for i in range(0, len(logits), _CrossEntropySum.ROWS):
            block = logits[i : i + _CrossEntropySum.ROWS].float()
            n = len(block)
            p = (block - lse[i : i + n, None]).exp_()  # softmax (a new block: logits stay intact)
            p[rows[:n], safe[i : i + n]] -= 1.0
            p.mul_((grad * valid[i : i + n]).unsqueeze(1))
            out[i : i + n] = p
        return out, None


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum over positions whose label is not IGNORE_INDEX of -log softmax(logits)[label].

    logits (..., V), labels (...). On the CPU a few rows at a time (_CrossEntropySum); on a GPU
    and under torch.compile torch's own cross-entropy: one kernel (a fused one when compiled)
    where the blocks would be hundreds of small launches.
    """
    flat, targets = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    if logits.device.type == "cpu" and not torch.compiler.is_compiling():
        return _CrossEntropySum.apply(flat, targets)
    return F.cross_entropy(flat.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not IGNORE_INDEX.

    logits (..., V), labels (...) of original token ids. Accumulated in fp32.
    """
    return cross_entropy_sum(logits, labels) / (labels != IGNORE_INDEX).sum().clamp(min=1)


def next_sentence_loss(
    logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """logits (B, 2), labels (B,) with 0 = IsNext, 1 = NotNext; cross-entropy (mean or sum)."""
    return F.cross_entropy(logits.float(), labels, reduction=reduction)


def batch_statistics(
    model: nn.Module, batch: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(summed MLM loss, summed NSP loss (0 without NSP), statistics) of one batch;
    statistics: MLM loss sum, masked count, MLM correct, NSP loss sum, sequences, NSP correct."""
    # A batch of full rows attends without a mask (SDPA's fastest kernels; no device read)
    mask = batch.attention_mask if batch.padded else None
    out: PreTrainingOutput = model(batch.input_ids, batch.token_type_ids, mask, batch.mlm_positions)
    logits, labels = out.mlm_logits, batch.mlm_labels
    mlm_sum = cross_entropy_sum(logits, labels)
    nsp_sum = nsp_correct = torch.zeros((), device=logits.device)
    if out.nsp_logits is not None:
        nsp_sum = next_sentence_loss(out.nsp_logits, batch.nsp_labels, reduction="sum")
        nsp_correct = (out.nsp_logits.argmax(-1) == batch.nsp_labels).sum().float()
    with torch.no_grad():
        valid = labels != IGNORE_INDEX
        stats = torch.stack(
            [
                mlm_sum.detach(),
                valid.sum().float(),
                ((logits.argmax(-1) == labels) & valid).sum().float(),
                nsp_sum.detach(),
                torch.tensor(float(len(batch.nsp_labels)), device=logits.device),
                nsp_correct,
            ]
        )
    return mlm_sum, nsp_sum, stats
