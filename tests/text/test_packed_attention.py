"""Packed rows at the model: with ``attention=``, each document of a row gets the logits it gets fed
alone, in tiny Hugging Face models built from configs (Llama, GPT-2 with its learned absolute
positions, Qwen2), on eager and SDPA attention (``"block-causal"``) and on the varlen arguments
transformers' flash-attention path takes (``"varlen"``, through a reference varlen attention
registered with transformers, as no flash-attention kernel runs on this CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import fastload
from fastload.converters import ConvertOptions, convert
from fastload.converters.convert_options import TokenizeOptions
from tests.text.conftest import VOCAB, real_paragraphs, write_jsonl

transformers = pytest.importorskip("transformers")

SEQ = 96
TOLERANCE = 1e-4
HALF_TOLERANCE = 2e-2  # float16 on a GPU: flash-attention against SDPA, each within its rounding


@pytest.fixture(scope="module")
def packed(tokenizer_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real paragraphs (with eos) as one token dataset: best-fit rows of SEQ tokens hold several each."""
    root = tmp_path_factory.mktemp("packed")
    write_jsonl(root / "docs.jsonl", real_paragraphs(400))
    convert(str(root / "docs.jsonl"), str(root / "ds"), ConvertOptions(
        source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer_file), append_eos=True)), quiet=True)
    return root / "ds"


def model(family: str, implementation: str) -> Any:
    """A two-layer model of ``family`` with random weights, made from its config at its defaults (use_cache too), no dropout."""
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=SEQ, resid_pdrop=0.0,
                                         embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        made = transformers.GPT2LMHeadModel(config)
    else:
        kind = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM), "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}
        config_class, model_class = kind[family]
        made = model_class(config_class(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=SEQ))
    made.config._attn_implementation = implementation
    return made.train()  # as in training (dropout off): the call a training loop makes


def worst_segment_error(net: Any, loader: Any, call: Any, batches: int = 3) -> tuple[float, int]:
    """The largest difference between a described segment's logits in its packed row and the segment
    fed alone, over ``batches`` batches, and how many rows held more than one segment."""
    worst, shared = 0.0, 0
    with torch.no_grad():
        for step, batch in enumerate(loader):
            if step == batches:
                break
            logits = call(net, batch)
            for r, segments in enumerate(loader.describe(step)):
                shared += len(segments) > 1
                column = 0
                for s in segments:
                    alone = net(input_ids=batch["input_ids"][r : r + 1, column : column + s["tokens"]]).logits[0]
                    worst = max(worst, (logits[r, column : column + s["tokens"]] - alone).abs().max().item())
                    column += s["tokens"]
    return worst, shared


def documented(net: Any, batch: dict[str, Any]) -> torch.Tensor:
    """The documented call for eager and SDPA: inputs, positions and the block-causal mask."""
    return net(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]).logits


def as_trainer_calls(net: Any, batch: dict[str, Any]) -> torch.Tensor:
    """What Hugging Face's Trainer does with a batch: the whole dict as keyword arguments."""
    return net(**batch).logits


def documented_varlen(net: Any, batch: dict[str, Any]) -> torch.Tensor:
    """The documented call for flash-attention: inputs, positions and the varlen arguments by transformers' names."""
    varlen = {name: batch[name] for name in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")}
    return net(input_ids=batch["input_ids"], position_ids=batch["position_ids"], **varlen).logits


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2"])
def test_block_causal_keeps_each_packed_document_apart(packed: Path, family: str, implementation: str) -> None:
    net = model(family, implementation)
    for batch_format, call in [("next-token", documented), ("transformers", as_trainer_calls)]:
        ld = fastload.DataLoader(str(packed), batch_size=3, seq_len=SEQ, packing="best-fit", batch_format=batch_format, attention="block-causal")
        worst, shared = worst_segment_error(net, ld, call)
        assert shared >= 3 and worst < TOLERANCE, (batch_format, worst)
    # what the mask replaces: positions alone, at the model's defaults, let the documents of a row attend to each other
    plain = fastload.DataLoader(str(packed), batch_size=3, seq_len=SEQ, packing="best-fit", batch_format="transformers")
    assert worst_segment_error(net, plain, as_trainer_calls)[0] > 100 * TOLERANCE


def reference_varlen_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                               scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """What flash-attention's varlen function computes, from the arguments transformers hands an
    attention implementation: causal attention within each ``cu_seq_lens`` span of the batch flattened to B * L tokens."""
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    assert attention_mask is None and torch.equal(cu_q, cu_k) and int(kwargs["max_length_q"]) == int((cu_q[1:] - cu_q[:-1]).max())
    batch, heads, length, dim = query.shape
    flat = [x.transpose(1, 2).reshape(1, batch * length, x.shape[1], dim).transpose(1, 2) for x in (query, key, value)]
    q, k, v = flat[0], *(x.repeat_interleave(heads // x.shape[1], dim=1) for x in flat[1:])
    segment = torch.repeat_interleave(torch.arange(len(cu_q) - 1), (cu_q[1:] - cu_q[:-1]).long())
    assert len(segment) == batch * length
    allowed = (segment[:, None] == segment[None, :]) & torch.ones(len(segment), len(segment), dtype=torch.bool).tril()
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scaling)
    return out.transpose(1, 2).reshape(batch, length, heads, dim), None


# GPT-2 hands the varlen arguments to its attention from transformers 5 on (4.53.3 and 4.56.2 drop them)
GPT2_VARLEN = pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="GPT-2 passes varlen arguments on from transformers 5")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", pytest.param("gpt2", marks=GPT2_VARLEN), "qwen2"])
def test_varlen_arguments_keep_each_packed_document_apart_on_the_flash_attention_path(packed: Path, family: str) -> None:
    transformers.AttentionInterface.register("fastload_reference_varlen", reference_varlen_attention)
    net = model(family, "fastload_reference_varlen")
    alone = model(family, "sdpa")  # the same weights (same seed), fed each document alone
    for batch_format in ("next-token", "transformers"):
        ld = fastload.DataLoader(str(packed), batch_size=3, seq_len=SEQ, packing="best-fit", batch_format=batch_format, attention="varlen",
                                 num_workers=1)
        batch = next(iter(ld))
        assert "attention_mask" not in batch and batch["cu_seq_lens_q"].dtype == torch.int32 and isinstance(batch["max_length_q"], int)
        with torch.no_grad():
            logits = documented_varlen(net, batch)
            for r, segments in enumerate(ld.describe(0)):
                column = 0
                for s in segments:
                    own = alone(input_ids=batch["input_ids"][r : r + 1, column : column + s["tokens"]]).logits[0]
                    assert (logits[r, column : column + s["tokens"]] - own).abs().max().item() < TOLERANCE, (batch_format, r)
                    column += s["tokens"]
        ld.close()


def flash_varlen_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                           scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' flash-attention path through PyTorch's own FlashAttention-2 varlen kernel
    (``torch.nn.attention.varlen.varlen_attn``, CUDA only): the batch flattened to B * L tokens, causal within each span."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    assert attention_mask is None
    batch, heads, length, dim = query.shape
    q, k, v = (x.transpose(1, 2).reshape(batch * length, x.shape[1], dim) for x in (query, key, value))
    k, v = (x.repeat_interleave(heads // x.shape[1], dim=1) for x in (k, v))
    causal = {"is_causal": True} if "is_causal" in inspect.signature(varlen_attn).parameters else {"window_size": (-1, 0)}
    out = varlen_attn(q, k, v, kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"], int(kwargs["max_length_q"]), int(kwargs["max_length_k"]),
                      scale=scaling, **causal)
    return out.reshape(batch, length, heads, dim), None


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", pytest.param("gpt2", marks=GPT2_VARLEN), "qwen2"])
def test_varlen_arguments_keep_each_packed_document_apart_in_a_real_flash_attention_kernel(packed: Path, family: str) -> None:
    """On a GPU, in half precision: flash-attention itself (``flash_attention_2`` where the flash_attn package is there, else
    PyTorch's FlashAttention-2 varlen kernel registered with transformers) fed the documented varlen call keeps each packed
    document apart (its logits as the document's fed alone through SDPA), and fed positions alone it does not."""
    try:
        import flash_attn  # noqa: F401
        implementation = "flash_attention_2"
    except ImportError:
        pytest.importorskip("torch.nn.attention.varlen")
        transformers.AttentionInterface.register("fastload_flash_varlen", flash_varlen_attention)
        implementation = "fastload_flash_varlen"
    half = {"dtype": torch.float16, "device": "cuda"}
    net, alone = model(family, implementation).to(**half), model(family, "sdpa").to(**half)
    ld = fastload.DataLoader(str(packed), batch_size=3, seq_len=SEQ, packing="best-fit", attention="varlen", device="cuda")
    worst, shared = 0.0, 0
    with torch.no_grad():
        for step, batch in enumerate(ld):
            if step == 3:
                break
            logits = documented_varlen(net, batch).float()
            for r, segments in enumerate(ld.describe(step)):
                shared += len(segments) > 1
                column = 0
                for s in segments:
                    own = alone(input_ids=batch["input_ids"][r : r + 1, column : column + s["tokens"]]).logits[0].float()
                    worst = max(worst, (logits[r, column : column + s["tokens"]] - own).abs().max().item())
                    column += s["tokens"]
        leaked = alone(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits.float()  # positions alone, SDPA
    assert shared >= 3 and worst < HALF_TOLERANCE, worst
    assert (leaked - documented_varlen(net, batch).float()).abs().max().item() > 10 * HALF_TOLERANCE  # the check can fail
    ld.close()


def test_the_mask_comes_the_same_from_workers_and_from_the_batch_sampler(packed: Path) -> None:
    ld = fastload.DataLoader(str(packed), batch_size=3, seq_len=SEQ, packing="best-fit", batch_format="transformers", attention="block-causal",
                             num_workers=1)
    batch = next(iter(ld))
    made = ld.batch_sampler.__iter__().__next__().fill(ld.dataset)  # what Trainer's skip_first_batches makes
    mask = batch["attention_mask"]
    assert mask.shape == (3, 1, SEQ, SEQ) and mask.dtype == torch.float32 and torch.equal(made["attention_mask"], mask)
    first = batch["position_ids"][0].tolist().index(0, 1)  # where the row's second segment starts
    assert mask[0, 0, first, first - 1] == torch.finfo(torch.float32).min and mask[0, 0, first, first] == 0 and mask[0, 0, 0, 1] < 0
    ld.close()
    with pytest.raises(ValueError, match="attention must be one of 'block-causal', 'varlen', got 'flash'"):
        fastload.DataLoader(str(packed), batch_size=3, seq_len=SEQ, attention="flash")
