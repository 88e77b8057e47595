"""Pre-training heads (masked LM + next sentence prediction) and their losses.

Devlin et al. 2018, section 3.1:
    masked LM:  logits = LayerNorm(GELU(W h)) @ E^T + b     E = word embeddings (tied)
    next sentence prediction: logits = W' pooler_output     (IsNext = 0, NotNext = 1)

The masked-LM head can score only chosen positions (`mlm_positions`): during pre-training only
~15% of tokens are predicted, and the (.., V) vocabulary projection is the single largest
matmul of a small BERT, so computing it for every position wastes most of a training step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoint import Pretrained
from ..config import BertConfig
from ..model import BertModel, BertOutput, activation, init_bert_weights


class MaskedLMHead(nn.Module):
    """Transform (dense + activation + LayerNorm), then the tied decoder with its own bias."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        """h (..., H), word_embeddings (V, H) -> logits (..., V)."""
        h = self.norm(self.act(self.transform(h)))
        return F.linear(h, word_embeddings, self.bias)


@dataclass
class PreTrainingOutput:
    """mlm_logits: (B, T, V), or (B, P, V) for mlm_positions (B, P). nsp_logits: (B, 2), None
    for a masked-LM-only model."""

    mlm_logits: torch.Tensor
    nsp_logits: torch.Tensor | None
    encoder: BertOutput


def _masked_lm_logits(
    mlm: MaskedLMHead, bert: BertModel, h: torch.Tensor, mlm_positions: torch.Tensor | None
) -> torch.Tensor:
    """Vocabulary logits of h (B, T, H) at mlm_positions (B, P), or at every position."""
    if mlm_positions is not None:
        index = mlm_positions.unsqueeze(-1).expand(-1, -1, h.shape[-1])  # (B, P, H)
        h = h.gather(1, index)  # (B, P, H)
    return mlm(h, bert.embeddings.word.weight)


class BertForPreTraining(Pretrained, nn.Module):
    """BERT with the masked-LM and next-sentence heads (HF `BertForPreTraining` layout)."""

    hf_architecture = "BertForPreTraining"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=True)
        self.mlm = MaskedLMHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2)
        for m in (self.mlm, self.nsp):
            m.apply(lambda mod: init_bert_weights(mod, config.initializer_range))
        nn.init.zeros_(self.mlm.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mlm_positions: torch.Tensor | None = None,
        **encoder_kwargs: Any,
    ) -> PreTrainingOutput:
        """mlm_positions (B, P): indices into T whose tokens to predict (Google's
        masked_lm_positions); without it every position is scored."""
        out = self.bert(input_ids, token_type_ids, attention_mask, **encoder_kwargs)
        assert out.pooler_output is not None
        return PreTrainingOutput(
            mlm_logits=_masked_lm_logits(self.mlm, self.bert, out.last_hidden_state, mlm_positions),
            nsp_logits=self.nsp(out.pooler_output),
            encoder=out,
        )


class BertForMaskedLM(Pretrained, nn.Module):
    """BERT with the masked-LM head only, no pooler (HF `BertForMaskedLM` layout): what
    masked-LM-only pre-training (`pretrain --no-nsp`) trains and writes."""

    hf_architecture = "BertForMaskedLM"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.mlm = MaskedLMHead(config)
        self.mlm.apply(lambda mod: init_bert_weights(mod, config.initializer_range))
        nn.init.zeros_(self.mlm.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mlm_positions: torch.Tensor | None = None,
        **encoder_kwargs: Any,
    ) -> PreTrainingOutput:
        """As BertForPreTraining.forward, with nsp_logits None."""
        out = self.bert(input_ids, token_type_ids, attention_mask, **encoder_kwargs)
        return PreTrainingOutput(
            mlm_logits=_masked_lm_logits(self.mlm, self.bert, out.last_hidden_state, mlm_positions),
            nsp_logits=None,
            encoder=out,
        )
