"""The encoder and pre-training heads against transformers' BERT on the same weights."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from bertforge import BertConfig, BertForPreTraining, BertModel, InputError, Tokenizer
from bertforge.data.instances import IGNORE_INDEX
from bertforge.tasks.pretraining import masked_lm_loss, next_sentence_loss
from tests.hard_cases import HARD_CASES


def _hf_bert(path: Path, **kwargs):
    import transformers

    return transformers.BertModel.from_pretrained(str(path), **kwargs).eval()


def _max_diff(ours, theirs, mask: torch.Tensor) -> tuple[float, float]:
    hidden = (ours.last_hidden_state - theirs.last_hidden_state)[mask.bool()].abs().max().item()
    pooled = (ours.pooler_output - theirs.pooler_output).abs().max().item()
    return hidden, pooled


def _read_tsv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


@pytest.mark.slow
@torch.no_grad()
def test_minilm_matches_transformers_on_real_sentences(data_dir: Path, minilm_dir: Path) -> None:
    """872 SST-2 dev sentences and 256 MRPC dev pairs, padded in batches of 32, fp32."""
    tok = Tokenizer.from_pretrained(minilm_dir)
    ours, theirs = BertModel.from_pretrained(minilm_dir), _hf_bert(minilm_dir)
    sentences = [r["sentence"] for r in _read_tsv(data_dir / "glue" / "SST-2" / "dev.tsv")]
    pairs = [
        (r["#1 String"], r["#2 String"]) for r in _read_tsv(data_dir / "glue" / "MRPC" / "dev.tsv")
    ][:256]
    assert len(sentences) == 872 and len(pairs) == 256
    batches = [tok(sentences[i : i + 32]) for i in range(0, len(sentences), 32)]
    batches += [
        tok([a for a, _ in pairs[i : i + 32]], [b for _, b in pairs[i : i + 32]])
        for i in range(0, 256, 32)
    ]
    worst = (0.0, 0.0)
    padded = 0
    for batch in batches:
        padded += int((batch["attention_mask"] == 0).sum())
        diff = _max_diff(ours(**batch), theirs(**batch), batch["attention_mask"])
        worst = (max(worst[0], diff[0]), max(worst[1], diff[1]))
    assert padded > 10_000  # the batches really are padded
    assert worst[0] < 1e-4 and worst[1] < 1e-4, (
        f"max |diff| hidden {worst[0]:.2e}, pooled {worst[1]:.2e}"
    )


@torch.no_grad()
def test_minilm_hidden_states_and_attentions_match_transformers(minilm_dir: Path) -> None:
    tok = Tokenizer.from_pretrained(minilm_dir)
    ours = BertModel.from_pretrained(minilm_dir)
    theirs = _hf_bert(minilm_dir, attn_implementation="eager")
    batch = tok(HARD_CASES[:12], HARD_CASES[12:24], max_length=96)
    mask = batch["attention_mask"].bool()
    a = ours(**batch, output_hidden_states=True, output_attentions=True)
    b = theirs(**batch, output_hidden_states=True, output_attentions=True)
    assert _max_diff(a, b, mask) < (1e-4, 1e-4)
    assert len(a.hidden_states) == len(b.hidden_states) == 7
    assert torch.equal(a.hidden_states[-1], a.last_hidden_state)
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert (x - y)[mask].abs().max() < 1e-4
    assert len(a.attentions) == 6
    for x, y in zip(a.attentions, b.attentions):
        assert x.shape == (12, 12, batch["input_ids"].shape[1], batch["input_ids"].shape[1])
        rows = mask[:, None, :, None].expand_as(x)
        assert (x - y)[rows].abs().max() < 1e-5
        assert torch.allclose(
            x.sum(-1)[mask[:, None, :].expand(-1, 12, -1)], torch.tensor(1.0), atol=1e-5
        )
        assert (x.masked_select(~mask[:, None, None, :]) == 0).all()  # no attention to padding


@torch.no_grad()
def test_padding_does_not_change_outputs(minilm_dir: Path) -> None:
    tok = Tokenizer.from_pretrained(minilm_dir)
    model = BertModel.from_pretrained(minilm_dir)
    texts = [
        "short",
        "a considerably longer sentence that forces padding on the others",
        "mid length one",
    ]
    batch = model(**tok(texts))
    for i, text in enumerate(texts):
        alone = model(**tok([text]))
        n = alone.last_hidden_state.shape[1]
        assert (batch.last_hidden_state[i, :n] - alone.last_hidden_state[0]).abs().max() < 1e-5
        assert (batch.pooler_output[i] - alone.pooler_output[0]).abs().max() < 1e-5


def _inputs(vocab_size: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (3, 21), generator=g)
    types = torch.zeros_like(ids)
    types[:, 11:] = 1
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    mask[2, 8:] = 0
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


@torch.no_grad()
def test_our_checkpoint_loads_in_transformers_with_same_logits(
    small_config: BertConfig, tmp_path: Path
) -> None:
    import transformers

    ours = BertForPreTraining(small_config).eval()
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertForPreTraining.from_pretrained(str(tmp_path)).eval()
    x = _inputs(small_config.vocab_size)
    a, b = ours(**x), theirs(**x)
    keep = x["attention_mask"].bool()
    assert (a.mlm_logits - b.prediction_logits)[keep].abs().max() < 1e-5
    assert (a.nsp_logits - b.seq_relationship_logits).abs().max() < 1e-5
    assert a.mlm_logits.abs().max() > 0.1  # real numbers, not a degenerate zero model


@torch.no_grad()
def test_transformers_checkpoint_loads_in_ours_with_same_logits(
    small_config: BertConfig, tmp_path: Path
) -> None:
    import transformers

    hf_config = transformers.BertConfig(**small_config.to_dict(google=True))
    theirs = transformers.BertForPreTraining(hf_config).eval()
    with torch.no_grad():  # make the MLM bias non-zero so a dropped bias would show
        theirs.cls.predictions.bias.normal_()
    theirs.save_pretrained(str(tmp_path))
    ours = BertForPreTraining.from_pretrained(tmp_path)
    x = _inputs(small_config.vocab_size, seed=2)
    a, b = ours(**x), theirs(**x)
    keep = x["attention_mask"].bool()
    assert (a.mlm_logits - b.prediction_logits)[keep].abs().max() < 1e-5
    assert (a.nsp_logits - b.seq_relationship_logits).abs().max() < 1e-5


@torch.no_grad()
def test_sparse_mlm_positions_equal_dense_logits(small_config: BertConfig) -> None:
    model = BertForPreTraining(small_config).eval()
    x = _inputs(small_config.vocab_size)
    positions = torch.tensor([[1, 4, 7], [2, 3, 14], [1, 5, 6]])
    dense = model(**x).mlm_logits
    sparse = model(**x, mlm_positions=positions).mlm_logits
    assert sparse.shape == (3, 3, small_config.vocab_size)
    assert torch.allclose(
        sparse, dense.gather(1, positions[..., None].expand(-1, -1, dense.shape[-1])), atol=1e-6
    )


def test_training_step_gradients_reach_every_parameter(small_config: BertConfig) -> None:
    model = BertForPreTraining(small_config).train()
    x = _inputs(small_config.vocab_size)
    labels = x["input_ids"].masked_fill(torch.rand(x["input_ids"].shape) > 0.3, IGNORE_INDEX)
    out = model(**x)
    loss = masked_lm_loss(out.mlm_logits, labels) + next_sentence_loss(
        out.nsp_logits, torch.tensor([0, 1, 0])
    )
    loss.backward()
    assert torch.isfinite(loss)
    without_grad = [
        n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0
    ]
    assert without_grad == []
    # the decoder is the embedding matrix: no separate output matrix exists
    assert not any("decoder" in n for n, _ in model.named_parameters())


def test_dropout_only_in_training(small_config: BertConfig) -> None:
    model = BertModel(small_config)
    x = _inputs(small_config.vocab_size)
    model.train()
    assert not torch.equal(model(**x).last_hidden_state, model(**x).last_hidden_state)
    model.eval()
    assert torch.equal(model(**x).last_hidden_state, model(**x).last_hidden_state)


def test_bf16_autocast_runs_and_stays_close() -> None:
    config = BertConfig.from_size("mini", vocab_size=1000)
    model = BertForPreTraining(config).eval()
    x = _inputs(1000)
    with torch.no_grad():
        full = model(**x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(**x)
    assert half.mlm_logits.dtype == torch.bfloat16
    cos = torch.nn.functional.cosine_similarity(
        full.encoder.last_hidden_state.flatten(1), half.encoder.last_hidden_state.float().flatten(1)
    )
    assert (cos > 0.99).all(), cos
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**x)
        loss = masked_lm_loss(out.mlm_logits, x["input_ids"]) + next_sentence_loss(
            out.nsp_logits, torch.tensor([0, 1, 1])
        )
    loss.backward()
    assert torch.isfinite(loss) and model.bert.embeddings.word.weight.grad is not None


def test_initialisation_follows_bert() -> None:
    config = BertConfig.from_size("mini", vocab_size=2000, initializer_range=0.02)
    model = BertForPreTraining(config)
    w = model.bert.layers[0].ffn["up"].weight
    assert abs(w.std().item() - 0.02) < 0.001 and abs(w.mean().item()) < 0.001
    assert torch.equal(model.bert.layers[0].ffn_norm.weight, torch.ones(256))
    assert torch.equal(model.bert.layers[0].attn["qkv"].bias, torch.zeros(768))
    assert torch.equal(model.mlm.bias, torch.zeros(2000))


def test_bad_inputs_give_clear_errors(small_config: BertConfig) -> None:
    model = BertModel(small_config).eval()
    with pytest.raises(
        InputError, match="sequence length 513 is more than the model's 512 positions"
    ):
        model(torch.zeros(1, 513, dtype=torch.long))
    with pytest.raises(
        InputError, match=f"token id {small_config.vocab_size} is outside the vocabulary"
    ):
        model(torch.tensor([[1, small_config.vocab_size]]))
    with pytest.raises(InputError, match="token_type_ids must be in"):
        model(torch.tensor([[1, 2]]), torch.tensor([[0, 2]]))
    with pytest.raises(InputError, match="input_ids must be"):
        model(torch.tensor([1, 2]))
