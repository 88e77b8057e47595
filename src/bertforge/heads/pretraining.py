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
from ..model import BertModel, BertOutput, LayerNorm, activation, init_bert_weights


class MaskedLMHead(nn.Module):
    """Transform (dense + activation + LayerNorm), then the tied decoder with its own bias."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        H, blocks = config.hidden_size, config.blocks
        self.transform = nn.Linear(H, H, bias=blocks.head_bias)
        self.act = activation(blocks.head_act or config.hidden_act)
        self.norm = LayerNorm(H, eps=config.layer_norm_eps, bias=blocks.norm_bias)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if blocks.decoder_bias else None

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


class BertForPreTraining(Pretrained, nn.Module):
    """BERT with the masked-LM and next-sentence heads (HF `BertForPreTraining` layout)."""

    hf_architecture = "BertForPreTraining"
    next_sentence = True  # the NSP head on the pooler (BertForMaskedLM: neither)

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=self.next_sentence)
        self.mlm = MaskedLMHead(config)
        heads = [self.mlm]
        if self.next_sentence:
            self.nsp = nn.Linear(config.hidden_size, 2)
            heads.append(self.nsp)
        for m in heads:
            m.apply(lambda mod: init_bert_weights(mod, config.initializer_range))

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
        h = out.last_hidden_state  # (B, T, H)
        if mlm_positions is not None:
            index = mlm_positions.unsqueeze(-1).expand(-1, -1, h.shape[-1])  # (B, P, H)
            h = h.gather(1, index)  # (B, P, H)
        nsp = self.nsp(out.pooler_output) if self.next_sentence else None
        return PreTrainingOutput(self.mlm(h, self.bert.embeddings.word.weight), nsp, out)


class BertForMaskedLM(BertForPreTraining):
    """BERT with the masked-LM head only, no pooler (HF `BertForMaskedLM` layout): what
    masked-LM-only pre-training (`pretrain --no-nsp`) trains and writes; nsp_logits is None."""

    hf_architecture = "BertForMaskedLM"
    next_sentence = False
