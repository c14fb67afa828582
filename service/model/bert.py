"""The BERT-family encoder and classification head, in plain torch: one forward pass for every family.

Why our own forward pass instead of `transformers`: every tensor, shape and copy is visible here, the
query/key/value projections are fused into one matrix multiply, and the last layer computes only what
the classifier reads (the [CLS] row), which saves most of that layer's work without changing a logit.
Parameter names are glassbox's own; `glassbox.service.model.weights` maps them to and from Hugging Face names.

The families (`glassbox.service.model.families`) differ only in the embeddings (token types or none, where position ids
start, ELECTRA's projection) and in the head's activation; the config says which, and this module reads it.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassbox.service.model.config import ModelConfig, family_named


def _activation(name: str) -> Callable[[Tensor], Tensor]:
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    return F.relu


_HEAD_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"tanh": torch.tanh, "relu": F.relu, "gelu": F.gelu}


def padding_bias(attention_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """[batch, seq] bool (True = real token) -> [batch, 1, 1, seq] additive bias for attention scores."""
    bias = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
    bias.masked_fill_(~attention_mask, torch.finfo(dtype).min)
    return bias[:, None, None, :]


class Embeddings(nn.Module):
    """Word + position (+ token type) embeddings, LayerNorm, and ELECTRA's projection up to the hidden size."""

    def __init__(self, config: ModelConfig, dropout: float) -> None:
        super().__init__()
        width = config.embedding_width
        self.word = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, width)
        # DistilBERT has no token types; RoBERTa has one (always row 0); BERT and ELECTRA tell pair segments apart.
        self.token_type = nn.Embedding(config.type_vocab_size, width) if config.type_vocab_size else None
        self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.project = nn.Linear(width, config.hidden_size) if config.embedding_size else None
        self.dropout = nn.Dropout(dropout)
        self.offset = config.position_offset  # RoBERTa: position ids start at pad_token_id + 1
        self.max_tokens = config.max_tokens

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        seq = input_ids.shape[1]
        # (Skipped while tracing: the recorded graph cannot raise; the engine's own inputs are already capped.)
        tracing = torch.jit.is_tracing()  # type: ignore[attr-defined,no-untyped-call]
        if not tracing and seq > self.max_tokens:
            # Without this check torch fails with a broadcast error that does not say what went wrong.
            raise ValueError(f"sequence length {seq} exceeds the model's {self.max_tokens} positions")
        x = self.word(input_ids) + self.position.weight[self.offset : self.offset + seq]  # [batch, seq, width]
        return self._finish(x, token_type_ids)

    def packed(self, input_ids: Tensor, packing: Packing, token_type_ids: Tensor | None = None) -> Tensor:
        """Embeddings of the real tokens only, back to back: [tokens, hidden]."""
        ids = input_ids.reshape(-1).index_select(0, packing.index)  # [tokens]
        positions = packing.index % packing.seq + self.offset  # [tokens]: each token's place in its own text
        types = None if token_type_ids is None else token_type_ids.reshape(-1).index_select(0, packing.index)
        return self._finish(self.word(ids) + self.position(positions), types)  # [tokens, hidden]

    def _finish(self, x: Tensor, token_type_ids: Tensor | None) -> Tensor:
        if self.token_type is not None:
            # Without type ids every token is segment 0: one row, broadcast, instead of a gather per token.
            x = x + (self.token_type.weight[0] if token_type_ids is None else self.token_type(token_type_ids))
        out: Tensor = self.dropout(self.norm(x))
        if self.project is not None:
            out = self.project(out)  # [..., embedding_size] -> [..., hidden]
        return out


class EncoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, dropout: float) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.qkv = nn.Linear(hidden, 3 * hidden)  # query, key and value projections fused
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.ffn_up = nn.Linear(hidden, config.intermediate_size)
        self.ffn_down = nn.Linear(config.intermediate_size, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.act = _activation(config.hidden_act)
        self.dropout = nn.Dropout(dropout)
        self.attn_dropout = dropout

    def forward(self, x: Tensor, bias: Tensor | None, cls_only: bool = False) -> Tensor:
        batch, seq, hidden = x.shape  # x: [batch, seq, hidden]
        qkv = self.qkv(x).view(batch, seq, 3, self.heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [batch, heads, seq, head_dim]
        if cls_only:
            # Only row 0 ([CLS]) feeds the pooler: attend from it alone; keys and values still span the text.
            q = q[:, :, :1]  # [batch, heads, 1, head_dim]
            x = x[:, :1]  # [batch, 1, hidden]
        ctx = self._attend(q, k, v, bias).reshape(batch, q.shape[2], hidden)  # [batch, q, hidden]
        return self._finish(x, ctx)

    def forward_packed(self, x: Tensor, packing: Packing, bias: Tensor | None, cls_only: bool = False) -> Tensor:
        """The same layer on real tokens only: x is [tokens, hidden], every text's tokens back to back.

        The projections and the feed-forward block (most of the work) see no padding at all. Attention runs text by
        text on the packed tokens when `bias` is None (`varlen_attention`); with a `bias` it scatters them into a
        [batch, seq] grid, attends with the padding masked, and gathers them back (training, and torch.export).
        """
        hidden = x.shape[1]  # x: [tokens, hidden]
        qkv = self.qkv(x)  # [tokens, 3*hidden]
        if bias is None:
            ctx = varlen_attention()(qkv, packing.offsets, self.heads, self.head_dim, cls_only)
            if cls_only:
                x = x.index_select(0, packing.cls_rows)  # [batch, hidden]
            return self._finish(x, ctx)
        grid = qkv.new_zeros(packing.batch * packing.seq, 3 * hidden).index_copy(0, packing.index, qkv)
        grid = grid.view(packing.batch, packing.seq, 3, self.heads, self.head_dim)  # padding rows stay zero
        q, k, v = grid.permute(2, 0, 3, 1, 4).unbind(0)  # each [batch, heads, seq, head_dim]
        if cls_only:
            q = q[:, :, :1]  # [batch, heads, 1, head_dim]
            x = x.index_select(0, packing.cls_rows)  # [batch, hidden]
        ctx = self._attend(q, k, v, bias).reshape(-1, hidden)  # [batch * q, hidden]
        if not cls_only:
            ctx = ctx.index_select(0, packing.index)  # [tokens, hidden]: the padding rows' output is dropped
        return self._finish(x, ctx)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
        p = self.attn_dropout if self.training else 0.0
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)  # [batch, heads, q, head_dim]
        return ctx.transpose(1, 2)  # [batch, q, heads, head_dim]

    def _finish(self, x: Tensor, ctx: Tensor) -> Tensor:
        x = self.attn_norm(x + self.dropout(self.attn_out(ctx)))
        out: Tensor = self.ffn_norm(x + self.dropout(self.ffn_down(self.act(self.ffn_up(x)))))
        return out


def _attend_text_by_text(qkv: Tensor, offsets: Tensor, heads: int, head_dim: int, cls_only: bool) -> Tensor:
    """Attention over packed tokens, one text at a time: qkv [tokens, 3*hidden] (every text's rows back to back,
    `offsets` [batch + 1] where each starts) -> [tokens, hidden], or [batch, hidden] with `cls_only` ([CLS] alone
    attends). No padding and no mask: a batch of mixed lengths pays attention on its real tokens only, as a batch
    of equal lengths does, instead of on a [batch, longest] grid with the padding masked (measured on the default
    model's mix in arrival order: attention's share of the forward pass 11-15% on the grid, 6-7% for sorted
    batches). Scripted, so that the recorded forward pass keeps the loop instead of unrolling it."""
    hidden = heads * head_dim
    bounds: list[int] = offsets.tolist()
    outs: list[Tensor] = []
    for i in range(len(bounds) - 1):
        start, end = bounds[i], bounds[i + 1]
        text = qkv[start:end].view(end - start, 3, heads, head_dim).permute(1, 2, 0, 3)  # [3, heads, len, head_dim]
        q = text[0][:, :1] if cls_only else text[0]  # [heads, q, head_dim]
        ctx = F.scaled_dot_product_attention(q.unsqueeze(0), text[1].unsqueeze(0), text[2].unsqueeze(0))
        outs.append(ctx[0].transpose(0, 1).reshape(-1, hidden))  # [q, hidden]
    return torch.cat(outs, 0)


@functools.cache
def varlen_attention() -> Callable[[Tensor, Tensor, int, int, bool], Tensor]:
    """`_attend_text_by_text`, scripted on first use (not at import: `glassbox serve` starts without it)."""
    with warnings.catch_warnings():
        # torch marks torch.jit deprecated; the recording of the forward pass that calls this is TorchScript too
        # (service/engines/script.py says why it stays).
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted: Callable[[Tensor, Tensor, int, int, bool], Tensor] = torch.jit.script(_attend_text_by_text)
    return scripted


class Packing:
    """Where the real tokens of a right-padded [batch, seq] batch sit once packed back to back.

    index: [tokens] position of each real token in the flattened [batch * seq] grid;
    cls_rows: [batch] the packed row of each text's first token ([CLS]);
    offsets: [batch + 1] where each text's rows start in the packed order, and where the last one ends.
    """

    def __init__(self, attention_mask: Tensor) -> None:
        self.batch, self.seq = attention_mask.shape
        self.index = attention_mask.reshape(-1).nonzero().squeeze(1)  # [tokens]
        lengths = attention_mask.sum(dim=1)  # [batch]
        ends = lengths.cumsum(0)  # [batch]
        self.cls_rows = ends - lengths  # [batch]
        self.offsets = torch.cat((ends.new_zeros(1), ends))  # [batch + 1]: text i is rows offsets[i]:offsets[i+1]


class BertClassifier(nn.Module):
    """input_ids [batch, seq] int64, attention_mask [batch, seq] bool or None, token_type_ids [batch, seq] int64 or
    None -> logits [batch, labels], for every family in `glassbox.service.model.families`."""

    def __init__(self, config: ModelConfig, dropout: float = 0.0) -> None:
        super().__init__()
        if config.num_labels == 0:
            raise ValueError("a classifier needs at least one label")
        self.config = config
        self.embeddings = Embeddings(config, dropout)
        self.layers = nn.ModuleList(EncoderLayer(config, dropout) for _ in range(config.num_hidden_layers))
        # The head, whatever the family calls it: dense -> activation -> dense on the first token's state (BERT's
        # pooler + classifier, DistilBERT's pre_classifier + classifier, RoBERTa's and ELECTRA's dense + out_proj).
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.head_activation = _HEAD_ACTIVATIONS[family_named(config.family).head_activation]
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.dropout = nn.Dropout(dropout)
        self.token_types = config.uses_token_types  # whether token_type_ids change anything
        # Padded batches run on real tokens only (see EncoderLayer.forward_packed). CUDA graphs need fixed shapes,
        # and packing depends on the data, so the graph engine turns this off on its private copy.
        self.unpad = True
        # In inference, packed batches attend text by text (no padded grid, no mask). Off while training (dropout
        # in attention keeps the grid's draws) and for torch.export, which cannot follow a loop over the texts.
        self.varlen_attention = True

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        last = len(self.layers) - 1
        types = token_type_ids if self.token_types else None
        if attention_mask is None or not self.unpad:
            x = self.embeddings(input_ids, types)  # [batch, seq, hidden]
            # None means "no padding in this batch": attention then needs no mask at all (faster kernels).
            bias = None if attention_mask is None else padding_bias(attention_mask, x.dtype)  # [batch, 1, 1, seq]
            for index, layer in enumerate(self.layers):
                x = layer(x, bias, cls_only=index == last)
            cls = x[:, 0]  # [batch, hidden]
        else:
            packing = Packing(attention_mask)
            x = self.embeddings.packed(input_ids, packing, types)  # [tokens, hidden]
            varlen = self.varlen_attention and not self.training
            bias = None if varlen else padding_bias(attention_mask, x.dtype)  # [batch, 1, 1, seq]
            for index, layer in enumerate(self.layers):
                x = cast(EncoderLayer, layer).forward_packed(x, packing, bias, cls_only=index == last)
            cls = x  # [batch, hidden]: the last layer kept only the [CLS] rows
        # The head may compute in a wider type than the encoder (the CPU's bf16 engine keeps it fp32: two small matrix
        # products, for logits as precise as the encoder's output allows).
        pooled = self.head_activation(self.pooler(cls.to(self.pooler.weight.dtype)))  # [batch, hidden]
        logits: Tensor = self.classifier(self.dropout(pooled))  # [batch, labels]
        return logits

    def init_weights(self, generator: torch.Generator, std: float = 0.02) -> None:
        """BERT's initialisation: normal(0, std) for matrices and embeddings, zeros/ones for biases/norms."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                with torch.no_grad():
                    module.weight.normal_(0.0, std, generator=generator)
                    if isinstance(module, nn.Linear) and module.bias is not None:
                        module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
