"""The GPU's fast paths, checked on the CPU: the compiled training step (train/loop.compiled,
`--compile`) and the encoder over packed tokens (model.Packing, `unpad`) give the eager padded
path's losses, gradients and outputs, on rows of mixed lengths, in one process and under DDP."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from bertforge import BertConfig, BertForPreTraining
from bertforge.data.pretraining import Batch
from bertforge.model import BertModel, Packing
from bertforge.tasks.pretraining import batch_statistics, cross_entropy_sum
from bertforge.train.loop import compiled, compiles

from .conftest import TINY
from .test_pretrain import data, losses, nodrop, pretrain_cmd, run  # noqa: F401 (fixtures)

SMALL = dict(  # conftest's TINY, narrower: compiled in seconds
    TINY,
    vocab_size=300,
    hidden_size=32,
    intermediate_size=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def mixed(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask of rows of these lengths, padded to the longest."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(5, SMALL["vocab_size"], (len(lengths), T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


def test_packed_encoder_gives_the_padded_outputs_at_real_tokens() -> None:
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SMALL)).eval()
    ids, mask = mixed([9, 3, 12, 1, 12])
    types = (torch.arange(ids.shape[1])[None] >= 2).long() * mask
    with torch.no_grad():
        padded = model(ids, types, mask, output_hidden_states=True, unpad=False)
        packed = model(ids, types, mask, output_hidden_states=True, unpad=True)
    real = mask.bool()[..., None]
    for a, b in zip(
        (padded.last_hidden_state, *padded.hidden_states),
        (packed.last_hidden_state, *packed.hidden_states),
        strict=True,
    ):
        assert torch.allclose(a * real, b, atol=1e-5)
        assert (b[~mask.bool()] == 0).all()  # nothing computed at padding
    assert torch.allclose(padded.pooler_output, packed.pooler_output, atol=1e-5)


def test_packing_round_trip_and_row_starts() -> None:
    _, mask = mixed([4, 1, 6])
    rows = Packing.of(mask)
    assert rows.starts.tolist() == [0, 4, 5, 11] and rows.longest == 6
    assert rows.starts.dtype == torch.int32
    x = torch.randn(3, 6, 2)
    assert torch.equal(rows.unpack(rows.pack(x)), x * mask[..., None])


def test_rows_made_on_the_host_are_the_device_s_packing_and_give_its_outputs() -> None:
    """Packing.of_lengths (a pipeline's batch, lengths known on the host) equals Packing.of
    (read from the mask), and the encoder given those rows gives the outputs it gives without
    them, packed or padded, for a padded batch and a full one."""
    import numpy as np

    torch.manual_seed(0)
    model = BertModel(BertConfig(**SMALL)).eval()
    for lengths in ([9, 3, 12, 1, 12], [7, 7, 7]):
        ids, mask = mixed(lengths)
        host = Packing.of_lengths(np.array(lengths), ids.shape[1], torch.device("cpu"))
        read = Packing.of(mask)
        assert torch.equal(host.index, read.index) and torch.equal(host.starts, read.starts)
        assert host.longest == read.longest and host.shape == read.shape
        assert host.padded == (min(lengths) < max(lengths))
        with torch.no_grad():
            want = model(ids, None, mask, unpad=False).last_hidden_state
            for unpad in (False, True):
                got = model(ids, None, mask, unpad=unpad, rows=host).last_hidden_state
                assert torch.allclose(got * mask[..., None], want * mask[..., None], atol=1e-5)


def test_inference_defaults_to_the_padded_path_on_the_cpu() -> None:
    """unpad's default: only a GPU (in bf16/fp16) packs; the CPU keeps its faster padded path."""
    from bertforge.model import unpads

    x = torch.zeros(2, 3, 4)
    assert not unpads(x, training=False) and not unpads(x.bfloat16(), training=False)


def batch(lengths: list[int], P: int, seed: int) -> Batch:
    ids, mask = mixed(lengths, seed)
    g = torch.Generator().manual_seed(seed + 100)
    pos = torch.stack([torch.randint(1, max(n - 1, 2), (P,), generator=g) for n in lengths])
    labels = ids.gather(1, pos)
    labels[0, -1] = -100  # a padded prediction slot
    nsp = torch.randint(0, 2, (len(lengths),), generator=g)
    return Batch(
        ids, torch.zeros_like(ids), mask, pos, labels, nsp, int(mask.sum()), bool((mask == 0).any())
    )


def step_loss(model: torch.nn.Module, b: Batch) -> torch.Tensor:
    mlm, nsp, _ = batch_statistics(model, b)
    return mlm / (b.mlm_labels != -100).sum() + nsp / len(b.nsp_labels)


def test_compiled_step_gives_the_eager_losses_and_gradients_on_mixed_lengths() -> None:
    """Full rows (no mask) and padded rows, two row lengths: the compiled forward + loss and
    its compiled backward against eager, whose MLM loss is the CPU's blocked cross-entropy."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**SMALL)).train()
    fn = compiled(step_loss)
    for b in (batch([16, 16, 16], 4, 1), batch([16, 7, 12], 4, 2), batch([9, 24], 4, 3)):
        grads = []
        for f in (step_loss, fn):
            loss = f(model, b)
            loss.backward()
            grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
            model.zero_grad()
        (l1, g1), (l2, g2) = grads
        assert torch.allclose(l1, l2, rtol=1e-5), (l1, l2)
        assert max((a - c).abs().max().item() for a, c in zip(g1, g2, strict=True)) < 1e-5


def test_low_precision_layernorm_keeps_the_stream_in_bf16_close_to_fp32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """model.LOW_PRECISION_LAYERNORM (MosaicBERT's, off by default): under bf16 autocast the
    LayerNorms, and so the residual stream, run in bf16; loss and gradients stay close to the
    fp32 LayerNorm's, the step compiles as one graph; without autocast nothing changes."""
    from bertforge import model as model_module

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**SMALL)).train()
    b = batch([16, 7, 12], 4, 2)
    runs = []
    for low in (False, True):
        monkeypatch.setattr(model_module, "LOW_PRECISION_LAYERNORM", low)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = step_loss(model, b)
            state = model.bert(b.input_ids, None, b.attention_mask).last_hidden_state
        loss.backward()
        runs.append((loss.detach(), state.dtype, [p.grad.clone() for p in model.parameters()]))
        model.zero_grad()
    (l32, d32, g32), (l16, d16, g16) = runs
    assert (d32, d16) == (torch.float32, torch.bfloat16)
    assert torch.allclose(l32, l16, rtol=1e-3)
    for a, c in zip(g32, g16, strict=True):
        assert (a - c).abs().max() <= 0.05 * a.abs().max() + 1e-6
    with torch.no_grad():  # no autocast: exactly nn.LayerNorm
        torch.manual_seed(1)
        want = model.bert(b.input_ids, None, b.attention_mask).last_hidden_state
        monkeypatch.setattr(model_module, "LOW_PRECISION_LAYERNORM", False)
        torch.manual_seed(1)
        assert torch.equal(model.bert(b.input_ids, None, b.attention_mask).last_hidden_state, want)
    monkeypatch.setattr(model_module, "LOW_PRECISION_LAYERNORM", True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained = torch._dynamo.explain(step_loss)(model, b)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_cross_entropy_sum_is_the_same_on_both_paths() -> None:
    logits = torch.randn(70, 50, requires_grad=True)
    labels = torch.randint(0, 50, (70,))
    labels[::7] = -100
    blocked = cross_entropy_sum(logits, labels)  # the CPU's
    (g1,) = torch.autograd.grad(blocked, logits)
    fused = torch.compile(cross_entropy_sum)(logits, labels)  # torch's (as on a GPU)
    (g2,) = torch.autograd.grad(fused, logits)
    assert torch.allclose(blocked, fused, rtol=1e-6) and torch.allclose(g1, g2, atol=1e-6)


def test_compile_setting() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert compiles(None, gpu) and not compiles(None, cpu)
    assert compiles(True, cpu) and not compiles(False, gpu)


@pytest.mark.slow
def test_compiled_pretraining_follows_eager_in_one_and_two_processes(
    data: Path,  # noqa: F811
    nodrop: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`pretrain --compile` (one process, and two under torchrun with gloo: DDP around the
    compiled step) takes the eager run's steps: the same losses within float noise."""
    common = ["--steps", "5", "--save-every", "0", "--eval-every", "0"]
    model = ("--config", str(nodrop))
    monkeypatch.setenv("TORCH_LOGS", "dynamo,graph_breaks")
    eager = run(pretrain_cmd(data, tmp_path / "eager", *common, "--no-compile", model=model))
    assert eager.returncode == 0, eager.stderr[-3000:]
    one = run(pretrain_cmd(data, tmp_path / "one", *common, "--compile", model=model))
    assert one.returncode == 0, one.stderr[-3000:]
    cmd = pretrain_cmd(data, tmp_path / "two", *common, "--compile", model=model)
    cmd[1:3] = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd[6:6] = ["-m", "bertforge"]
    two = run(cmd)
    assert two.returncode == 0, two.stderr[-3000:]
    base = losses(tmp_path / "eager")
    assert [s for s, _ in base] == list(range(1, 6))
    for other in (losses(tmp_path / "one"), losses(tmp_path / "two")):
        assert [s for s, _ in other] == [s for s, _ in base]
        assert max(abs(x - y) / y for (_, x), (_, y) in zip(other, base)) < 1e-4, (other, base)
    # compiled indeed (dynamo's log): one process as one graph; under DDP its forward runs
    # outside the graph (the reducer's hooks), by PyTorch's design: the step's only break
    assert "torchdynamo start tracing" not in eager.stderr
    assert "torchdynamo start tracing" in one.stderr
    assert "graph break" not in one.stderr.lower()
    breaks = re.split(r"graph break (?:\([^)]*\) )?in user code at ", two.stderr, flags=re.I)
    assert "torchdynamo start tracing" in two.stderr and len(breaks) > 1
    for text in breaks[1:]:  # each: where, why (up to the user's stack)
        reason = text.split("User code traceback")[0]
        assert "DistributedDataParallel" in reason or "parallel/distributed.py" in reason, reason


def test_pretraining_batches_keep_one_prediction_width(data: Path) -> None:  # noqa: F811
    """Every batch has the spec's max_predictions_per_seq slots (a compiled step keeps its
    shapes), the ones a row does not use ignored; and says whether it has padding."""
    from bertforge.data.shards import ShardSet
    from bertforge.train.distributed import Dist
    from bertforge.train.pretrain import PretrainConfig, make_task

    cfg = PretrainConfig(data=str(data), out="unused", max_seq_length=64, batch_size=8)
    task = make_task(cfg, ShardSet(str(data)), Dist())
    seen = set()
    for _, (micro, _) in zip(range(6), task.batches(None)):
        b = micro[0]
        assert (
            b.mlm_positions.shape[1]
            == b.mlm_labels.shape[1]
            == task.stream.spec.max_predictions_per_seq
        )
        assert b.padded == bool((b.attention_mask == 0).any())
        seen.add(b.padded)
    assert seen  # at least one kind of batch


def test_compiled_fine_tuning_takes_the_eager_steps(
    tmp_path: Path, tiny_model_nodrop: Path
) -> None:
    """`finetune --compile` (a classification head, rows of mixed lengths): the eager run's
    losses, step for step."""
    from bertforge.cli import main
    from tests.task_files import keyword_table

    base = tiny_model_nodrop
    train = keyword_table(tmp_path / "train.tsv", 32, seed=0)
    curves = []
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        out = tmp_path / name
        args = ["finetune", "--model", str(base), "--task", "sst2", "--train", str(train)]
        args += ["--out", str(out), "--epochs", "1", "--batch-size", "8", "--precision", "fp32"]
        assert main([*args, "--no-progress", "--log-every", "1", *extra]) == 0
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        curves.append([r["loss"] for r in rows if "loss" in r])
    eager, compiled_run = curves
    assert len(eager) == 4 and len(compiled_run) == 4
    assert max(abs(a - b) / a for a, b in zip(eager, compiled_run, strict=True)) < 1e-4


def test_packed_path_refuses_attention_maps() -> None:
    from bertforge.errors import InputError

    model = BertModel(BertConfig(**SMALL)).eval()
    ids, mask = mixed([4, 2])
    with pytest.raises(InputError, match="attention maps"):
        model(ids, None, mask, output_attentions=True, unpad=True)
