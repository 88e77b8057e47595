"""The BERT encoder: embeddings -> L post-LayerNorm Transformer blocks -> pooler.

Shape legend (used in comments and docstrings throughout):
    B   batch size                    T   sequence length (tokens, incl. [CLS]/[SEP]/padding)
    H   hidden size                   nh  number of attention heads
    hs  head size = H / nh            I   feed-forward (intermediate) size, 4H in BERT
    V   vocabulary size               L   number of layers

Architecture (Devlin et al. 2018; Vaswani et al. 2017), exactly as Google's and HF's BERT:
    x = LayerNorm(word[ids] + token_type[segments] + position[0..T-1]); dropout
    per layer:  x = LayerNorm(x + dropout(Attn(x)))        attention over all positions
                x = LayerNorm(x + dropout(W2 GELU(W1 x)))   feed-forward of width I
    pooler:     tanh(W x[:, 0])                            the [CLS] vector
Other families (bertforge.families) are this encoder with a few fields changed. DistilBERT
(config.model_type "distilbert"): no segment embeddings (type_vocab_size 0: token_type_ids are
ignored), optionally fixed sinusoidal positions, and its classifiers' pre_classifier is the
pooler with ReLU instead of tanh. RoBERTa, XLM-RoBERTa, CamemBERT: positions counted from
pad_token_id + 1 past each row's padding (HF's create_position_ids_from_input_ids) and one
segment (token_type_ids are read as 0). MPNet: relative position buckets added to every
layer's scores. ModernBERT (config.blocks): pre-norm blocks
    x = x + Attn(LN(x)) with rotary q, k (no LN before layer 0); x = x + W2 (GELU(a) * g),
    [a, g] = W1 LN(x); a final LN after the last layer; no biases; local attention (keys within
    64 positions either side) in two layers of three.
Query, key and value are one fused (3H, H) projection here; checkpoint.py splits and joins it
for HF's separate query/key/value tensors.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .checkpoint import Pretrained
from .config import BertConfig
from .errors import InputError
from .runner import to_device


def activation(name: str) -> Any:
    """The feed-forward non-linearity named in the config."""
    if name == "gelu":
        return F.gelu  # exact (erf) GELU, as Google's BERT
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    raise ValueError(f"unknown activation {name!r}")


class _CPUDropout(torch.autograd.Function):
    """Dropout with a cheaper mask on CPUs: 16 random bits per element, cut from 64-bit draws
    (torch's CPU bernoulli_ costs as much per element as the 64-bit draw here). The keep
    probability is 1 - round(p * 65536) / 65536, within 1e-5 of 1 - p."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, p: float) -> torch.Tensor:
        words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
        bits = words.view(torch.int16)[: x.numel()].view(x.shape)
        keep = bits >= round(p * 65536) - 32768  # the int16 lane read as an unsigned 16-bit draw
        scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x * keep * scale

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        return grad * keep * ctx.scale, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout, with a faster mask on the CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        return _CPUDropout.apply(x, p)
    return F.dropout(x, p, True)


def set_dropout(model: nn.Module, p: float) -> None:
    """Every dropout in `model` (embeddings, attention, layers, a head's classifier) at p while it
    trains; its config, and so what is saved, keeps the architecture's own. The modules read
    their rates at run time from `p` (and a layer's `attn_dropout`)."""
    for module in model.modules():
        for name in ("p", "attn_dropout"):
            if isinstance(getattr(module, name, None), (int, float)):
                setattr(module, name, float(p))


@dataclass
class BertOutput:
    """What BertModel returns.

    last_hidden_state: (B, T, H)
    pooler_output:     (B, H), tanh(W h_[CLS]); None for a model built without a pooler
    hidden_states:     with output_hidden_states, L+1 tensors (B, T, H): embeddings, then each layer
    attentions:        with output_attentions, L tensors (B, nh, T, T) of attention probabilities
    """

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


# Under bf16/fp16 autocast, LayerNorm runs in fp32 (autocast's rule), so the residual stream
# between the layers is fp32. True: LayerNorm in the autocast dtype, and the stream with it
# (MosaicBERT's low-precision LayerNorm): half the bytes for the memory-bound work around each
# LayerNorm, 16 of a 48.6 ms BERT-base step on an H200 (benchmarks/results/gpu.md). Off until
# a GPU measures it (benchmarks/gpu.py's pre-training variant "ours_lp_layernorm").
LOW_PRECISION_LAYERNORM = False


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm; in bf16 under bf16 autocast where LOW_PRECISION_LAYERNORM says so."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind, bf16 = x.device.type, torch.bfloat16  # not fp16: its range is too narrow
        low = LOW_PRECISION_LAYERNORM and torch.is_autocast_enabled(kind)
        if low and torch.get_autocast_dtype(kind) == bf16:
            with torch.autocast(kind, enabled=False):
                weight = self.weight.to(bf16)
                bias = None if self.bias is None else self.bias.to(bf16)
                return F.layer_norm(x.to(bf16), self.normalized_shape, weight, bias, self.eps)
        return super().forward(x)


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        H, blocks = config.hidden_size, config.blocks
        # the padding's row learns nothing from where it is read (a random replacement of a
        # masked piece), as the families built on transformers' code have it; BERT's as
        # Google's (every row)
        pad = None if config.family.base == "bert" else config.pad_token_id
        self.word = nn.Embedding(config.vocab_size, H, padding_idx=pad)
        # rotary positions (ModernBERT) turn q and k in each layer instead of a table
        self.position = None if blocks.rotary else nn.Embedding(config.max_position_embeddings, H)
        self.token_type = (
            nn.Embedding(config.type_vocab_size, H) if config.type_vocab_size else None
        )
        self.norm = LayerNorm(H, eps=config.layer_norm_eps, bias=blocks.norm_bias)
        self.p = (
            config.hidden_dropout_prob
            if blocks.embedding_dropout is None
            else blocks.embedding_dropout
        )
        self.sinusoidal = config.sinusoidal_pos_embds
        # RoBERTa's positions start past the padding id; None: positions 0..T-1
        self.pad = config.pad_token_id if config.family.position_offset else None

    def fix_positions(self) -> None:
        """DistilBERT's sinusoidal positions: fixed, not trained (HF's
        create_sinusoidal_embeddings)."""
        assert self.position is not None  # DistilBERT's table
        n, H = self.position.weight.shape
        angle = torch.arange(n, dtype=torch.float64)[:, None] / torch.pow(
            10000.0, 2 * (torch.arange(H) // 2) / H
        )
        with torch.no_grad():
            self.position.weight[:, 0::2] = torch.sin(angle[:, 0::2]).float()
            self.position.weight[:, 1::2] = torch.cos(angle[:, 1::2]).float()
        self.position.weight.requires_grad_(False)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T) ids -> (B, T, H)."""
        T = input_ids.shape[1]
        if self.position is None:  # rotary: positions are applied in the layers
            x = self.word(input_ids)
            return dropout(self.norm(x), self.p, self.training)
        if position_ids is None and self.pad is not None:
            # each real token's place among the row's real tokens, past the padding id; the
            # padding itself at pad (HF's create_position_ids_from_input_ids, so equal outputs
            # wherever the padding is)
            real = input_ids.ne(self.pad)
            position_ids = real.cumsum(1) * real + self.pad
        # (T, H) broadcast over the batch, unless positions are given per example
        position = self.position.weight[:T] if position_ids is None else self.position(position_ids)
        x = self.word(input_ids)
        if self.token_type is not None:  # HF's order of the sums (rounding): word + type + position
            x = x + self.token_type(token_type_ids)
        x = x + position
        return dropout(self.norm(x), self.p, self.training)


Rope = tuple[torch.Tensor, torch.Tensor]  # rotary cos and sin, broadcast over q and k


class Layer(nn.Module):
    """One Transformer block: self-attention, then feed-forward; post-LayerNorm (BERT's) or
    pre-LayerNorm with a GeGLU feed-forward (ModernBERT's), as config.blocks says."""

    def __init__(self, config: BertConfig, index: int = 0) -> None:
        super().__init__()
        H, I = config.hidden_size, config.intermediate_size
        blocks = config.blocks
        self.nh = config.num_attention_heads
        self.attn_dropout = config.attention_probs_dropout_prob
        self.pre_norm, self.glu = blocks.pre_norm, blocks.glu
        self.window = blocks.window(index)  # local attention's half-width; None: global
        self.theta = blocks.rotary[index] if blocks.rotary else None
        bias = blocks.attention_bias
        self.attn = nn.ModuleDict(
            {"qkv": nn.Linear(H, 3 * H, bias=bias), "out": nn.Linear(H, H, bias=bias)}
        )
        eps, norm_bias = config.layer_norm_eps, blocks.norm_bias
        # pre-norm: layer 0 reads the embeddings' norm, with none of its own (ModernBERT's)
        first = self.pre_norm and index == 0
        self.attn_norm = nn.Identity() if first else LayerNorm(H, eps=eps, bias=norm_bias)
        up = 2 * I if self.glu else I  # GeGLU: a value and a gate
        self.ffn = nn.ModuleDict(
            {
                "up": nn.Linear(H, up, bias=blocks.mlp_bias),
                "down": nn.Linear(I, H, bias=blocks.mlp_bias),
            }
        )
        self.ffn_norm = LayerNorm(H, eps=eps, bias=norm_bias)
        self.act = activation(config.hidden_act)
        self.p = config.hidden_dropout_prob

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        return_probs: bool = False,
        rope: Rope | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, H), mask (B, 1, 1, T) or (B, 1, T, T) bool (True = attend), or (B or 1, nh,
        T, T) floats added to the scores (relative positions, padding at the dtype's minimum),
        or None; rope: rotary cos, sin (T, hs) -> (B, T, H)."""
        B, T, H = x.shape
        h = self.attn_norm(x) if self.pre_norm else x
        q, k, v = (
            self.attn["qkv"](h).view(B, T, 3, self.nh, H // self.nh).permute(2, 0, 3, 1, 4)
        )  # each (B, nh, T, hs)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        p = self.attn_dropout if self.training else 0.0
        probs = None
        # the ONNX exporter's SDPA with a float mask (relative positions) gives an output it
        # cannot reshape: exported, such a model attends in the explicit form
        exported = mask is not None and mask.is_floating_point() and torch.compiler.is_exporting()
        if return_probs or exported or (x.device.type == "cpu" and self.training):
            # The explicit form: when the probabilities themselves are wanted, and for training
            # on the CPU, where torch's SDPA kernels are slower (measured on AVX-512 BF16:
            # forward + backward 59 vs 111 ms in bf16, 80 vs 99 ms in fp32). Inference takes SDPA
            # in fp32 and bf16 alike: with torch 2.13 on the same CPU, bf16, 12 heads of 32,
            # masked rows, it is 3.3 vs 15.8 ms (32 rows of 128), 5.8 vs 38.7 ms (16 of 256),
            # 9.8 vs 77.9 ms (8 of 512), 2.1 vs 3.8 ms (128 of 32).
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
            if mask is not None and mask.is_floating_point():  # relative positions' scores
                scores = scores + mask.to(scores.dtype)
            elif mask is not None:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            probs = scores.softmax(dim=-1)
            y = dropout(probs, p, self.training) @ v
        else:
            if mask is not None and mask.is_floating_point():
                mask = mask.to(q.dtype)  # SDPA adds a float mask of the query's dtype
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        y = y.transpose(1, 2).reshape(B, T, H)  # (B, T, nh, hs) -> (B, T, H)
        return self._after_attention(x, y), (probs if return_probs else None)

    def _after_attention(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x, attention's y (..., H) -> the block's output: projection, residual, feed-forward,
        residual, each with its LayerNorm after (BERT) or before (pre-norm)."""
        if self.pre_norm:  # ModernBERT: its attention dropout after the projection too
            x = x + dropout(self.attn["out"](y), self.attn_dropout, self.training)
            return x + self._feed_forward(self.ffn_norm(x))
        x = self.attn_norm(x + dropout(self.attn["out"](y), self.p, self.training))
        return self.ffn_norm(x + dropout(self._feed_forward(x), self.p, self.training))

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """(.., H) -> (.., I) -> (.., H); GeGLU: act(value) * gate, dropped out before W2."""
        if not self.glu:
            return self.ffn["down"](self.act(self.ffn["up"](x)))
        value, gate = self.ffn["up"](x).chunk(2, dim=-1)
        return self.ffn["down"](dropout(self.act(value) * gate, self.p, self.training))

    def packed(self, x: torch.Tensor, rows: Packing, rope: Rope | None = None) -> torch.Tensor:
        """The block over packed tokens: x (N, H), the real tokens of the batch's rows one after
        another (`rows` says where each row starts); rope: cos, sin (N, 1, hs); no work on
        padding."""
        N, H = x.shape
        h = self.attn_norm(x) if self.pre_norm else x
        q, k, v = self.attn["qkv"](h).view(N, 3, self.nh, H // self.nh).unbind(1)  # (N, nh, hs)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        y = rows.attend(q, k, v, self.window).reshape(N, H)
        return self._after_attention(x, y)


def rotary_tables(positions: torch.Tensor, theta: float, dim: int) -> Rope:
    """Rotary positions' cos and sin (..., dim) at `positions` (...) for base `theta`: the
    frequencies theta^(-2i/dim), each used twice (transformers' layout: halves, not pairs),
    in fp32 as transformers computes them."""
    device = positions.device
    inverse = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
    angles = positions[..., None].float() * inverse
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """q or k (..., hs) turned by its positions' angles, in fp32, back in x's dtype."""
    x32 = x.float()
    first, second = x32.chunk(2, dim=-1)
    return (x32 * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)


def local_mask(mask: torch.Tensor | None, T: int, window: int, device: torch.device) -> Any:
    """Local attention's mask: keys within `window` positions of the query (either side) and
    not padding, (B or 1, 1, T, T) bool. A padded query keeps itself, so that no row is empty
    (an empty row's NaN would reach the real rows through its value)."""
    positions = torch.arange(T, device=device)
    near = (positions[:, None] - positions[None, :]).abs() <= window  # (T, T)
    if mask is None:
        return near[None, None]
    itself = torch.eye(T, dtype=torch.bool, device=device)
    return near & (mask | itself)


@dataclass
class Packing:
    """Where a padded (B, T) batch's real tokens are once packed into (N,): `index` (N,) their
    places in the flattened batch, `starts` (B + 1,) int32 where each row begins (cu_seqlens),
    `longest` the longest row. Rows are the mask's runs of ones from position 0."""

    index: torch.Tensor
    starts: torch.Tensor
    longest: int
    shape: tuple[int, int]

    @classmethod
    def of(cls, attention_mask: torch.Tensor) -> Packing:
        lengths = attention_mask.sum(1, dtype=torch.int32)
        starts = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
        index = attention_mask.flatten().nonzero().squeeze(1)
        return cls(index, starts, int(lengths.max()), tuple(attention_mask.shape))

    @classmethod
    def of_lengths(cls, lengths: np.ndarray, width: int, device: torch.device) -> Packing:
        """The same for a batch of rows of `lengths` padded to `width`, made on the host (a
        pipeline's batch, whose lengths it knows): the device reads nothing back for it."""
        index = np.flatnonzero(np.arange(width) < lengths[:, None])
        starts = np.zeros(len(lengths) + 1, np.int32)
        np.cumsum(lengths, out=starts[1:])
        moved = (to_device(torch.from_numpy(a), device) for a in (index, starts))
        return cls(*moved, int(lengths.max(initial=0)), (len(lengths), width))

    @property
    def padded(self) -> bool:
        """Whether any row is shorter than the batch (known without reading the device)."""
        return self.index.numel() < self.shape[0] * self.shape[1]

    @property
    def positions(self) -> torch.Tensor:
        """(N,) each packed token's place in its row."""
        return self.index % self.shape[1]

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)."""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros where the batch was padded."""
        out = x.new_zeros(self.shape[0] * self.shape[1], *x.shape[1:])
        return out.index_copy_(0, self.index, x).unflatten(0, self.shape)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None
    ) -> torch.Tensor:
        """Attention within each row of packed (N, nh, hs) q, k, v (with `window`: keys within
        that many positions either side): flash attention over the variable-length rows on a
        GPU; elsewhere (the CPU, tests) SDPA over the re-padded batch, the same numbers."""
        varlen = varlen_attention() if q.is_cuda else None  # CUDA only: the varlen flash kernel
        if varlen is not None:
            w = (-1, -1) if window is None else (window, window)
            return varlen(
                q, k, v, self.starts, self.starts, self.longest, self.longest, window_size=w
            )
        mask = self.unpack(torch.ones(len(q), dtype=torch.bool, device=q.device))
        mask = mask[:, None, None, :]
        if window is not None:
            mask = local_mask(mask, self.shape[1], window, q.device)
        q, k, v = (self.unpack(t).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.pack(y.transpose(1, 2))


@functools.cache
def varlen_attention() -> Callable[..., torch.Tensor] | None:
    """PyTorch's variable-length flash attention (torch >= 2.10), None where torch lacks it.
    Imported on first use, by a GPU: importing it loads torch._dynamo, 2 s of every command's
    start on the CPU."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # pragma: no cover - older torch: the padded path
        return None
    return varlen_attn


def check_inputs(
    config: BertConfig,
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    values: bool = True,
) -> None:
    """Clear errors for a batch that would otherwise fail deep inside torch (or, on a GPU, kill
    its context): its shape, and with `values` its ids (which reads them: on a GPU the queue
    waits for it; a pipeline checks its batches on the host before they go)."""
    if input_ids.dim() != 2:
        raise InputError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
    T = input_ids.shape[1]
    if config.max_tokens < T:
        raise InputError(
            f"sequence length {T} is more than the model's {config.max_tokens} positions "
            f"(max_position_embeddings={config.max_position_embeddings}); truncate the input "
            "(tokenizer max_length)"
        )
    if not values:
        return
    if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= config.vocab_size):
        raise InputError(
            f"token id {int(input_ids.max())} is outside the vocabulary (vocab_size="
            f"{config.vocab_size}): does the tokenizer's vocab.txt belong to this model?"
        )
    if (
        token_type_ids is not None
        and config.type_vocab_size > 1  # one segment: the model reads every token as segment 0
        and token_type_ids.numel()
        and (token_type_ids.max() >= config.type_vocab_size or token_type_ids.min() < 0)
    ):
        raise InputError(f"token_type_ids must be in [0, type_vocab_size={config.type_vocab_size})")


class Pooler(nn.Module):
    """The vector a sequence head reads: BERT's tanh(W h_[CLS]) (DistilBERT's pre_classifier:
    ReLU); ModernBERT's head, LayerNorm(act(W pool(h))) with pool the first token or the mean
    of the real tokens, the same transform over each token for its token and span heads."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        H, blocks = config.hidden_size, config.blocks
        self.dense = nn.Linear(H, H, bias=blocks.head_bias)
        self.norm = (
            LayerNorm(H, eps=config.layer_norm_eps, bias=blocks.norm_bias)
            if blocks.head_norm
            else None
        )
        if blocks.head_act is not None:
            self.act = activation(blocks.head_act)
        else:  # BERT's tanh; DistilBERT's ReLU
            self.act = torch.relu if config.family.pooler_act == "relu" else torch.tanh
        self.mean = blocks.pooling == "mean"

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        """(.., H) -> (.., H): dense, non-linearity, the LayerNorm where there is one."""
        h = self.act(self.dense(h))
        return h if self.norm is None else self.norm(h)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """x (B, T, H) -> (B, H)."""
        if not self.mean:
            return self.transform(x[:, 0])
        if attention_mask is None:
            return self.transform(x.mean(1))
        weights = attention_mask.to(x.dtype)[..., None]  # (B, T, 1)
        return self.transform((x * weights).sum(1) / weights.sum(1))


class BertModel(Pretrained, nn.Module):
    """The BERT encoder (and pooler). `BertModel.from_pretrained(dir)` loads HF checkpoints."""

    hf_architecture = "BertModel"

    def __init__(self, config: BertConfig, add_pooling_layer: bool | None = None) -> None:
        """add_pooling_layer None: the family's (BERT's pooler; none for a DistilBERT)."""
        super().__init__()
        self.config = config
        if add_pooling_layer is None:
            add_pooling_layer = config.family.pooler
        blocks = config.blocks
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config, i) for i in range(config.num_hidden_layers))
        # pre-norm blocks end with a norm of their own (ModernBERT's final_norm)
        self.final_norm = (
            LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=blocks.norm_bias)
            if blocks.pre_norm
            else None
        )
        # MPNet: one score per head for each relative position bucket, shared by every layer
        self.relative_bias = (
            nn.Embedding(
                config.extras.get("relative_attention_num_buckets", RELATIVE_BUCKETS),
                config.num_attention_heads,
            )
            if config.family.relative_buckets
            else None
        )
        self.pooler = Pooler(config) if add_pooling_layer else None
        self.apply(lambda m: init_bert_weights(m, config.initializer_range))
        if blocks.pre_norm:  # residual branches' outputs smaller with depth (ModernBERT's)
            std = config.initializer_range / math.sqrt(2.0 * config.num_hidden_layers)
            for layer in self.layers:
                for out in (layer.attn["out"], layer.ffn["down"]):
                    nn.init.normal_(out.weight, std=std)
        if config.sinusoidal_pos_embds:
            self.embeddings.fix_positions()

    def check_inputs(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, values: bool = True
    ) -> None:
        check_inputs(self.config, input_ids, token_type_ids, values)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        unpad: bool | None = None,
        rows: Packing | None = None,
    ) -> BertOutput:
        """input_ids, token_type_ids, attention_mask: (B, T); attention_mask 1 = real token.
        unpad: the layers over the real tokens only (Packing; states at padding are 0), by
        default for inference in bf16/fp16 on a GPU when the batch has padding.
        rows: the batch's rows as its maker knows them on the host (Packing.of_lengths), its
        ids already checked there (check_inputs on the host tensors): nothing is read back."""
        # Traced or compiled (ONNX export, torch.compile): no data-dependent branches.
        tracing = torch.compiler.is_compiling() or torch.jit.is_tracing()
        # Training on a GPU reads nothing back: its batches come from our own pipelines, and a
        # read would stall the device's queue every step (an all-ones mask: pass None instead).
        reads = not tracing and rows is None and not (self.training and input_ids.is_cuda)
        if not tracing:
            self.check_inputs(input_ids, token_type_ids, values=reads)
        if token_type_ids is None or self.config.type_vocab_size == 1:
            # one segment (RoBERTa): a pair's second text is segment 0 too, as its tokenizer says
            token_type_ids = torch.zeros_like(input_ids)
        mask = None
        if attention_mask is not None and (
            rows.padded if rows is not None else not reads or not bool(attention_mask.all())
        ):
            mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): keys to attend to
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        if self.relative_bias is not None:  # (1, nh, T, T) scores, padding at the minimum
            mask = relative_scores(self.relative_bias, x.shape[1], x.device, mask)
            kind = x.device.type
            if torch.is_autocast_enabled(kind):  # the layers' dtype: cast once, not per layer
                mask = mask.to(torch.get_autocast_dtype(kind))
        hidden = [x] if output_hidden_states else None
        probs = [] if output_attentions else None
        if unpad is None:
            unpad = not tracing and not output_attentions and unpads(x, self.training)
            unpad = unpad and self.relative_bias is None  # the varlen kernel adds no scores
        if unpad and output_attentions:
            raise InputError("unpad=True: attention maps come from the padded path only")
        if mask is not None and unpad:
            assert attention_mask is not None  # mask is made from it
            x = self._packed_layers(x, rows or Packing.of(attention_mask), hidden)
        else:
            x = self._padded_layers(x, mask, position_ids, hidden, probs)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if hidden is not None:  # the last layer's state as the model returns it (HF's)
                hidden[-1] = x
        pooled = None if self.pooler is None else self.pooler(x, attention_mask)
        return BertOutput(
            last_hidden_state=x,
            pooler_output=pooled,
            hidden_states=tuple(hidden) if hidden is not None else None,
            attentions=tuple(probs) if probs is not None else None,
        )

    def token_states(self, h: torch.Tensor) -> torch.Tensor:
        """What a token or span head reads of the states h (.., H): ModernBERT's head over each
        token (dense + act + LayerNorm), else h itself."""
        if self.config.blocks.token_head:
            assert self.pooler is not None, "built with add_pooling_layer=True"
            return self.pooler.transform(h)
        return h

    def _padded_layers(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        hidden: list[torch.Tensor] | None,
        probs: list[torch.Tensor | None] | None,
    ) -> torch.Tensor:
        """The layers over the padded batch x (B, T, H), each with its mask (local attention's
        band where the layer's window is shorter than the rows) and rotary positions."""
        T = x.shape[1]
        ropes = self._ropes(
            torch.arange(T, device=x.device) if position_ids is None else position_ids
        )
        local: dict[int, torch.Tensor] = {}
        # traced (ONNX, torch.compile), the band is always built: a branch on the example's
        # length would be kept for every length
        traced = torch.compiler.is_compiling() or torch.jit.is_tracing()
        for layer in self.layers:
            layer_mask = mask
            if layer.window is not None and (traced or layer.window < T - 1):
                if layer.window not in local:
                    local[layer.window] = local_mask(mask, T, layer.window, x.device)
                layer_mask = local[layer.window]
            rope = ropes.get(layer.theta)
            x, p = layer(x, layer_mask, return_probs=probs is not None, rope=rope)
            if hidden is not None:
                hidden.append(x)
            if probs is not None:
                probs.append(p)
        return x

    def _ropes(self, positions: torch.Tensor) -> dict[float | None, Rope]:
        """Rotary cos and sin at `positions` for each base the layers use (none without)."""
        dim = self.config.hidden_size // self.config.num_attention_heads
        thetas = set(self.config.blocks.rotary)
        return {theta: rotary_tables(positions, theta, dim) for theta in thetas}

    def _packed_layers(
        self, x: torch.Tensor, rows: Packing, hidden: list[torch.Tensor] | None
    ) -> torch.Tensor:
        """The layers over the real tokens of x (B, T, H) only: (B, T, H), 0 at padding; each
        layer's output, so padded, appended to `hidden` (its embeddings too, replaced)."""
        x = rows.pack(x)
        if hidden is not None:
            hidden[0] = rows.unpack(x)
        ropes = {t: (c[:, None], s[:, None]) for t, (c, s) in self._ropes(rows.positions).items()}
        for layer in self.layers:
            x = layer.packed(x, rows, ropes.get(layer.theta))
            if hidden is not None:
                hidden.append(rows.unpack(x))
        return rows.unpack(x)


RELATIVE_BUCKETS = 32  # MPNet's relative position buckets (HF computes with 32 whatever the config)
RELATIVE_DISTANCE = 128  # distances from here on share the last bucket of their sign


def relative_buckets(T: int, device: torch.device) -> torch.Tensor:
    """(T, T) bucket of each key's position relative to each query's, T5's bidirectional
    buckets as MPNet computes them: half the buckets for keys after the query, exact distances
    up to 8, then logarithmic up to RELATIVE_DISTANCE."""
    positions = torch.arange(T, device=device)
    n = positions[:, None] - positions[None, :]  # query - key
    half = RELATIVE_BUCKETS // 2
    bucket = (n < 0).long() * half
    n = n.abs()
    exact = half // 2
    large = (
        exact
        + (
            torch.log(n.float() / exact) / math.log(RELATIVE_DISTANCE / exact) * (half - exact)
        ).long()
    )
    return bucket + torch.where(n < exact, n, large.clamp(max=half - 1))


def relative_scores(
    table: nn.Embedding, T: int, device: torch.device, mask: torch.Tensor | None
) -> torch.Tensor:
    """The scores relative positions add to attention, (1, nh, T, T); with a padding mask
    (B, 1, 1, T), (B, nh, T, T) with the padded keys at the dtype's minimum."""
    scores = table(relative_buckets(T, device)).permute(2, 0, 1)[None]  # (1, nh, T, T)
    if mask is None:
        return scores
    return scores.masked_fill(~mask, torch.finfo(scores.dtype).min)


# Inference on a GPU skips padding (Packing) where it can; False: padded batches, as on the CPU
UNPAD_ON_GPU = True


def unpads(x: torch.Tensor, training: bool) -> bool:
    """Whether the encoder runs over packed tokens by default: inference on a GPU in bf16 or
    fp16 (the variable-length flash kernel's types), where torch has that kernel. Not for
    training (its attention dropout) nor on the CPU (length-sorted batches pad little there,
    and the re-padding fallback would cost more)."""
    if not (UNPAD_ON_GPU and x.is_cuda and varlen_attention() is not None) or training:
        return False
    half = (torch.float16, torch.bfloat16)
    autocast = torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") in half
    return autocast or x.dtype in half


def init_bert_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: N(0, std) weights (truncated in TF, plain here, as HF), zero biases,
    unit LayerNorm."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        if module.bias is not None:  # ModernBERT's norms have none
            nn.init.zeros_(module.bias)
