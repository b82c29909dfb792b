"""Tiny transformers configs derived by rule from a config class's defaults.

``tiny_config("jamba")`` starts from ``AutoConfig.for_model("jamba")`` (the class's defaults: the
real model's sizes) and shrinks it with rules keyed on field names and value types, so that any
architecture transformers maps (the causal-LM sweep ``bench/bench_causal_lm_sweep.py``, a later
base-model sweep) gets a model of a few hundred thousand parameters without a per-model table.
Only the config's own constructor fields are set; the fields it derives itself (``head_dim`` from
``hidden_size``, ``layer_types`` from a pattern, …) are left to its ``__post_init__`` unless a rule
needs them.

The rules (sizes are upper bounds: a smaller default is kept; 0 and ``None`` stay):

- **Layers**: every layer count (``num_hidden_layers``, ``n_layer``, ``decoder_layers``, …) becomes
  ``layers`` or the smallest count that keeps every distinct kind of layer. What tells layers
  apart is read generically, one column per field: a list as long as the layer count
  (``layer_types``, ``layers_block_type``, ``mlp_layer_types``, ``no_rope_layers``, a per-layer
  ``intermediate_size``, …), a list of layer indices (``full_attn_idxs``, ``moe_layers``,
  ``hybrid_layer_ids``: membership), ``per_layer_config``, a threshold (``first_k_dense_replace``,
  ``max_window_layers``, ``*_start_index``, ``*_end_index``: below or not), a count shared from
  the end (``num_kv_shared_layers``) and consecutive parts adding up to the count
  (``n_input_layers`` + ``n_recurrent_layers`` + ``n_output_layers``). The first layer of each
  distinct combination is kept, then the next layers up to ``layers``; every such field is cut
  to the kept layers (indices renumbered, thresholds and parts recounted). A shorter list of
  kinds (``block_types``: a cycle) raises the count until each kind occurs; a ``[[kinds,
  repeat]]`` list (``attention_types``) gets repeats that cover the count. Periods
  (``*_period``, ``*_interval``, ``*window_pattern``, ``*_step``, ``*every_n_layers``) are clamped
  to the count, offsets below their period, block sizes (``n_layers_per_*``) to 1.
- **Hybrid kinds**: a hybrid whose defaults are all state layers (``layer_types`` all
  ``linear_attention``) while it has attention heads (Bamba, GraniteMoeHybrid) gets full attention
  on its last layer, through its own field (the kinds list, or the ``attn_layer_indices`` it is
  derived from); a ``layer_types`` the config leaves ``None`` and does not derive (LFM2-MoE) gets
  the state kinds its modeling module compares it with, then full attention.
- **Widths**: hidden sizes 64; a width that was a multiple or a fraction of the hidden size keeps
  the ratio, one equal to an enclosing config's hidden size (``adapter_in_dim``) becomes 64, a
  list adding up to it is rescaled (``axial_pos_embds_dim``). Attention heads 4; key/value heads 1
  where the default is one (MQA), 4 where it equals the heads (MHA), else 2; value heads of
  linear attention keep their ratio to its key heads. Every head dim 16 (a head dim that was the
  sum of ``qk_nope_head_dim`` and ``qk_rope_head_dim`` stays their sum), ``rotary_dim`` 8;
  intermediate sizes 128 (per-layer lists element-wise); low ranks (``*_rank``: ``kv_lora_rank``,
  …) 32; rounding multiples (``*multiple_of``) 16.
- **Experts**: counts 4, top-k 2 (also where the defaults leave it unset), expert groups 2
  (selected groups 1), shared experts 1.
- **Vocabulary** 512 (every ``*vocab_size*``; a field equal to the vocabulary size follows it);
  every special token id (``*_token_id``, ``*_token_index``, lists of them) is kept below it:
  ids past it are renumbered, distinct ids to distinct ids from the top of the vocabulary. A
  config without a vocabulary (a multimodal wrapper) uses its text config's.
- **State space**: state sizes (``state_size``, ``d_state``, ``ssm_state_size``,
  ``mamba_d_state``) 16, ``time_step_rank``/``dt_rank`` 4, conv kernels (``conv_kernel``,
  ``d_conv``, ``conv_L_cache``, …) 4; SSM heads (``mamba_n_heads``, ``n_mamba_heads``, a Mamba-2
  ``num_heads``) are the inner width (``mamba_d_ssm``, else ``expand × hidden``) over the SSM head
  dim (16); SSM groups 2, or 1 where 2 does not divide the heads.
- **Positions and windows**: ``max_position_embeddings``-like fields between 256 and 512; an
  ``original_max_position_embeddings`` keeps its ratio to it; sliding windows 8 (a window as
  wide as the default positions or wider never slides: it becomes the new positions); chunk
  sizes (``chunk_size``, ``attention_chunk_size``, ``mamba_chunk_size``) 16: a 6-token prompt
  plus 12 new tokens crosses both.
- **RoPE parameters** (also one dict per layer type): lists of the rotary half width are cut,
  integer sections adding up to it rescaled, position fields follow the positions rule.
- **Nested configs** (``text_config``, ``vision_config``, …): shrunk recursively by the same rules.
- **Derived fields**: a field declared with a ``None`` default whose value is the one the class
  computes (``head_dim`` from ``hidden_size``, ``num_key_value_heads``, Zamba 2's widths) is not
  passed, so the config computes it from the tiny values; per-layer lists are always passed.
- **Defaults among choices**: a ``default_X`` left ``None`` beside a list ``Xs`` of names is its
  first (Xmod's ``default_language`` among ``languages``: the model refuses to run without one).
- :data:`OVERRIDES`: the few values no rule derives, each with its reason.

Usage::

    from bench.tiny_config import tiny_config, tiny_model
    cfg = tiny_config("qwen3_next")                  # a PretrainedConfig: linear and full layers
    lm = tiny_model("qwen3_next")                    # AutoModelForCausalLM, eval, seeded
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import re
from collections.abc import Callable, Iterable
from typing import Any

HIDDEN = 64
HEADS = 4
HEAD_DIM = 16
ROTARY_DIM = 8
INTERMEDIATE = 128
RANK = 32
EXPERTS = 4
TOP_K = 2
VOCAB = 512
STATE = 16
CONV = 4
DT_RANK = 4
MAX_POSITIONS = 512
MIN_POSITIONS = 256
WINDOW = 8
CHUNK = 16
SSM_GROUPS = 2
MULTIPLE_OF = 16

#: Values no rule can derive, by model type: field -> value.
OVERRIDES: dict[str, dict[str, Any]] = {
    # Zamba ties the weights of its shared transformer across its hybrid layers: with one hybrid
    # layer transformers finds nothing to tie and raises, so two of the four layers are hybrid.
    "zamba": {"num_hidden_layers": 4, "layers_block_type": ["linear_attention", "hybrid"] * 2},
    # xLSTM's config rounds its query/key and value widths (hidden × qk_dim_factor 0.5, × 1.0) up
    # to multiples of 64 while the model does not: a hidden size of 64 gives states of two shapes.
    "xlstm": {"hidden_size": 128, "embedding_dim": 128},
    # Jamba's default asks for the CUDA Mamba kernels, and transformers 4.x then refuses the CPU;
    # 5.x ignores the field (with a warning) and picks the PyTorch scan where no kernels load.
    "jamba": {"use_mamba_kernels": False},
}


# --- field-name patterns -------------------------------------------------------------------------

_LAYER_COUNT = re.compile(
    r"^((.+_)?num_hidden_layers|num_layers|n_layers?|(en|de)coder_layers|num_(en|de)coder_layers"
    r"|num_blocks|depth)$"
)
_PERIOD = re.compile(r"(_period|_interval|window_pattern|_step|every_n_layers|layer_group_size)$")
_OFFSET = re.compile(r"_offset$")
_THRESHOLD = re.compile(
    r"^(first_k_dense_replace|num_dense_layers|max_window_layers|.*_start_index|.*_index_start"
    r"|.*_end_index|.*_index_end)$"
)
_FROM_END = re.compile(r"_shared_layers$")
_PART = re.compile(r"^(n|num)_[a-z]+_layers$")
_BLOCK = re.compile(r"^n_layers_per_")
_PARTS = " parts"  # the column of consecutive parts (no field has this name)
_INDEX_LIST = re.compile(r"(layer|idx|indices|indexes|_ids$)")
_KV_HEADS = re.compile(
    r"^(.*num_key_value_heads|num_kv_heads|kv_n_heads|multi_query_group_num|num_query_groups"
    r"|.*num_key_heads)$"
)
_VALUE_HEADS = re.compile(r"num_value_heads$")
_SSM_HEADS = re.compile(r"^(mamba_n_heads|mamba_num_heads|n_mamba_heads)$")
_HEADS = re.compile(
    r"^(.*num_attention_heads|n_heads?|num_heads|.*attention_heads|.*_n_heads|.*_num_heads"
    r"|heads_per_.*)$"
)
_SSM_HEAD_DIM = re.compile(r"^(mamba_d_head|mamba_head_dim|mamba_headdim)$")
_HEAD_DIM = re.compile(r"(head_dim|head_size|d_head|dim_head|headdim|kv_channels)")
_ROTARY_DIM = re.compile(r"^rotary_dim$")
_INTERMEDIATE = re.compile(
    r"(intermediate_size|ffn_dim|ffn_hidden_size|^dim_ff$|^dff$|^mlp_dim$|feed_forward_size"
    r"|^d_inner$|^n_inner$|^mamba_d_ssm$)"
)
_HIDDEN = re.compile(
    r"^(hidden_size|n_embd|d_model|embed_dim|embedding_dim|emb_dim|dim|word_embed_proj_dim"
    r"|lru_width|.*_hidden_size|hidden_size_.*|.*_embed_dim|.*embedding_size)$"
)
_RANK = re.compile(r"_rank$")
_MULTIPLE_OF = re.compile(r"multiple_of$")
_MAIN_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")
_WIDTH_LIKE = re.compile(r"(dim|hidden|_size$|width)")
_NOT_WIDTH = re.compile(r"(vocab|position|window|chunk|image|patch|batch|token|sampl|length)")
_DT_RANK = re.compile(r"(dt_rank|time_step_rank)$")
_EXPERTS = re.compile(
    r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|zero_expert_num)$"
)
_TOP_K = re.compile(
    r"^(num_experts_per_tok(en)?|moe_k|moe_top_?k|top_k_experts|num_selected_experts)$"
)
_EXPERT_GROUPS = re.compile(r"^(n_group|num_expert_group)$")
_TOPK_GROUP = re.compile(r"^topk_group$")
_SHARED_EXPERTS = re.compile(r"^(n_shared_experts|num_shared_experts|moe_num_shared_experts)$")
_VOCAB = re.compile(r"vocab_size|_vocab$")
_TOKEN_ID = re.compile(r"(_token_id|_token_index|_token_ids|^begin_suppress_tokens)$")
_STATE = re.compile(r"^(state_size|d_state|ssm_state_size|mamba_d_state)$")
_CONV = re.compile(
    r"(conv_kernel|conv_kernel_size|d_conv|conv_kernel_dim|conv_l_cache|conv1d_width)$"
)
_SSM_GROUPS = re.compile(r"^(n_groups|mamba_n_groups|mamba_ngroups)$")
_EXPAND = re.compile(r"^(expand|mamba_expand)$")
_POSITIONS = re.compile(
    r"^(max_position_embeddings|n_positions|n_ctx|max_seq_len|context_length"
    r"|max_target_positions|max_source_positions|model_max_length)$"
)
_ORIGINAL_POSITIONS = re.compile(r"^original_max_position_embeddings$")
_WINDOW = re.compile(
    r"^(sliding_window|sliding_window_size|attention_window_size|local_attention_window_len"
    r"|keep_window_size|window_size|local_attention)$"
)
_CHUNK = re.compile(
    r"^(chunk_size|attention_chunk_size|mamba_chunk_size|local_attn_chunk_length"
    r"|lsh_attn_chunk_length)$"
)

#: Fields never touched (bookkeeping, not sizes).
_SKIP = {
    "architectures",
    "id2label",
    "label2id",
    "transformers_version",
    "model_type",
    "dtype",
    "torch_dtype",
    "chunk_size_feed_forward",
    "num_labels",
}


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- the config's own fields ---------------------------------------------------------------------


def _field_names(config: Any) -> list[str]:
    if dataclasses.is_dataclass(config):
        return [f.name for f in dataclasses.fields(config)]
    import inspect

    return [p for p in inspect.signature(type(config).__init__).parameters if p != "self"]


def _sub_configs(config: Any) -> dict[str, Any]:
    from transformers import PretrainedConfig

    out = {}
    for name in _field_names(config):
        try:
            value = getattr(config, name)
        except Exception:  # a heterogeneous config refuses some global reads
            continue
        if isinstance(value, PretrainedConfig):
            out[name] = value
    return out


# --- layer structure -----------------------------------------------------------------------------


def _columns(values: dict[str, Any], count: int) -> dict[str, list[Any]]:
    """What tells the layers of one layer count apart, one column (a value per layer) per field.

    Per-layer lists, layer-index lists (membership), ``per_layer_config`` (the layer's overrides),
    layer thresholds (``first_k_dense_replace``: below or not), shared-from-the-end counts
    (``num_kv_shared_layers``) and consecutive parts (``n_input_layers``, ``n_recurrent_layers``,
    …: which part).
    """
    columns: dict[str, list[Any]] = {}
    for name, value in values.items():
        if name in _SKIP or _TOKEN_ID.search(name):
            continue
        if isinstance(value, (list, tuple)) and value:
            if (
                _INDEX_LIST.search(name)
                and all(_int(v) and 0 <= v < count for v in value)
                and list(value) == sorted(set(value))
                and not all(v in (0, 1) for v in value)
            ):
                members = set(value)
                columns[name] = [i in members for i in range(count)]
            elif len(value) == count:
                columns[name] = [repr(v) for v in value]
        elif _int(value) and 0 < value < count:
            if _THRESHOLD.match(name):
                columns[name] = [i < value for i in range(count)]
            elif _FROM_END.search(name):
                columns[name] = [i >= count - value for i in range(count)]
    per_layer = values.get("per_layer_config")
    if isinstance(per_layer, dict) and per_layer:
        overrides = {int(k): repr(v) for k, v in per_layer.items()}
        if all(0 <= k < count for k in overrides):
            columns["per_layer_config"] = [overrides.get(i) for i in range(count)]
    parts = _parts(values, count)
    if parts:
        bounds = list(itertools.accumulate(values[name] for name in parts))
        columns[_PARTS] = [bisect.bisect_right(bounds, i) for i in range(count)]
    return columns


def _parts(values: dict[str, Any], count: int) -> list[str]:
    """Consecutive part counts (``n_*_layers``) that add up to the layer count, in field order."""
    names = [
        k
        for k, v in values.items()
        if _PART.match(k) and not _LAYER_COUNT.match(k) and not _FROM_END.search(k) and _int(v)
    ]
    return names if len(names) > 1 and sum(values[k] for k in names) == count else []


def _keep(columns: dict[str, list[Any]], count: int, layers: int) -> list[int]:
    """The first layer of each distinct combination of kinds, then the next ones up to ``layers``."""
    keep, seen = [], set()
    for i in range(count):
        signature = tuple(column[i] for column in columns.values())
        if signature not in seen:
            seen.add(signature)
            keep.append(i)
    for i in range(count):
        if len(keep) >= layers:
            break
        if i not in keep:
            keep.append(i)
    return sorted(keep)


def _cycle_need(values: dict[str, Any], counts: set[int]) -> int:
    """Layers needed so that a short cyclic list of kinds (``block_types``) shows each kind."""
    need = 0
    for name, value in values.items():
        if (
            isinstance(value, (list, tuple))
            and len(value) > 1
            and len(value) not in counts
            and all(isinstance(v, str) for v in value)
            and re.search(r"(types|pattern|layers)$", name)
        ):
            firsts = {v: value.index(v) for v in value}
            need = max(need, max(firsts.values()) + 1)
    return need


def _repeat_pattern(value: Any) -> bool:
    """``[[kinds, repeat], ...]`` (GPT-Neo's ``attention_types``)."""
    return (
        isinstance(value, (list, tuple))
        and bool(value)
        and all(
            isinstance(item, (list, tuple))
            and len(item) == 2
            and isinstance(item[0], (list, tuple))
            and _int(item[1])
            for item in value
        )
    )


def _cut(name: str, value: Any, keep: list[int], count: int, columns: dict[str, list[Any]]) -> Any:
    """``value`` of a column field for the kept layers."""
    position = {old: new for new, old in enumerate(keep)}
    if name == "per_layer_config":
        return {position[int(k)]: v for k, v in value.items() if int(k) in position}
    if isinstance(value, (list, tuple)):
        if len(value) == count and not isinstance(columns[name][0], bool):
            return [value[i] for i in keep]
        return [position[i] for i in value if i in position]
    if _THRESHOLD.match(name):
        return sum(i < value for i in keep)
    return sum(i >= count - value for i in keep)  # from the end


def _shrink_layers(values: dict[str, Any], layers: int, out: dict[str, Any]) -> int:
    """Sets the layer counts and per-layer fields in ``out``; returns the main layer count."""
    counts = {v for k, v in values.items() if _LAYER_COUNT.match(k) and _int(v) and v > 0}
    patterns = {k: v for k, v in values.items() if _repeat_pattern(v)}
    target = max(layers, _cycle_need(values, counts))
    for value in patterns.values():
        target = max(target, sum(len(kinds) for kinds, _ in value))
    new_count: dict[int, int] = {}
    for count in sorted(counts):
        if count <= target:
            new_count[count] = count
            continue
        columns = _columns(values, count)
        keep = _keep(columns, count, target)
        new_count[count] = len(keep)
        for name in columns:
            if name != _PARTS:
                out[name] = _cut(name, values[name], keep, count, columns)
        first = 0
        for part in _parts(values, count):  # each part keeps its kept layers
            out[part] = sum(first <= i < first + values[part] for i in keep)
            first += values[part]
    for name, value in values.items():
        if _LAYER_COUNT.match(name) and _int(value) and new_count.get(value, value) != value:
            out[name] = new_count[value]
    main = max(new_count.values(), default=target)
    for name, value in patterns.items():
        width = sum(len(kinds) for kinds, _ in value)
        out[name] = [[list(kinds), 1] for kinds, _ in value]
        kinds = value[-1][0]
        out[name][-1][1] += max(main - width, 0) // len(kinds)  # the last item fills the count
    return main


def _shrink_layer_scalars(values: dict[str, Any], main: int, out: dict[str, Any]) -> None:
    """Periods clamped to the layer count, offsets below their period, block sizes 1."""
    for name, value in values.items():
        if name in out or not _int(value) or value <= 0:
            continue
        if _BLOCK.match(name):
            out[name] = 1
        elif _PERIOD.search(name) and value > main:
            out[name] = main
    for name, value in values.items():
        period_name = name[: -len("_offset")] + "_period"
        if _OFFSET.search(name) and _int(value) and value > 0 and period_name in values:
            period = out.get(period_name, values[period_name])
            if _int(period) and value > period - 1:
                out[name] = period - 1  # (an offset without its period, vocab_offset, stays)


# --- widths ---------------------------------------------------------------------------------------


def _ratio(value: int, base: int, new_base: int) -> int | None:
    """``value`` scaled like ``base -> new_base`` when it is a whole multiple or fraction of it."""
    if not base or not _int(value) or value <= 0:
        return None
    if value % base == 0 or base % value == 0:
        scaled = value * new_base // base
        return scaled if scaled >= 1 else None
    return None


def _width(
    name: str, value: int, hidden: int | None, heads: int | None, hiddens: frozenset[int]
) -> int | None:
    """The tiny value of one width field, or ``None`` where no width rule applies."""
    if _SSM_HEADS.match(name) or _SSM_HEAD_DIM.match(name) or _VALUE_HEADS.search(name):
        return None  # set from their inner width or key heads
    if _KV_HEADS.match(name):
        if value == 1:
            return 1
        return HEADS if heads is not None and value == heads else min(value, 2)
    if _HEADS.match(name) and "dim" not in name:
        return min(value, HEADS)
    if _ROTARY_DIM.match(name):
        return min(value, ROTARY_DIM)
    if _HEAD_DIM.search(name):
        return min(value, HEAD_DIM)
    if _INTERMEDIATE.search(name):
        return min(value, INTERMEDIATE)
    if _DT_RANK.search(name):
        return min(value, DT_RANK)
    if _RANK.search(name):
        return min(value, RANK)
    if _MULTIPLE_OF.search(name):
        return min(value, MULTIPLE_OF)
    if _HIDDEN.match(name) and "vocab" not in name:
        if name in _MAIN_HIDDEN:
            return min(value, HIDDEN)
        scaled = _ratio(value, hidden, HIDDEN) if hidden else None
        return scaled if scaled is not None else min(value, HIDDEN)
    if value in hiddens and _WIDTH_LIKE.search(name) and not _NOT_WIDTH.search(name):
        return HIDDEN  # a width equal to a hidden size (``adapter_in_dim``, ``out_hidden_size``)
    return None


def _shrink_widths(values: dict[str, Any], out: dict[str, Any], hiddens: frozenset[int]) -> None:
    hidden = next((values[k] for k in _MAIN_HIDDEN if _int(values.get(k))), None)
    hiddens = hiddens | ({hidden} if hidden else set())
    heads = next(
        (
            values[k]
            for k in ("num_attention_heads", "n_head", "n_heads", "num_heads")
            if _int(values.get(k))
        ),
        None,
    )
    is_ssm = any(_EXPAND.match(k) for k in values) and any(_STATE.match(k) for k in values)
    for name, value in values.items():
        if name in _SKIP or (name in out and not isinstance(out[name], list)):
            continue
        if is_ssm and name == "num_heads" and "num_attention_heads" not in values:
            continue  # Mamba-2 heads: set with the SSM heads
        value = out.get(name, value)
        if _int(value) and value > 0:
            new = _width(name, value, hidden, heads, hiddens)
            if new is not None:
                out[name] = new
        elif isinstance(value, (list, tuple)) and value and all(_int(v) and v > 0 for v in value):
            # a per-layer list of widths (Gemma 3n's intermediate_size): each element
            news = [_width(name, v, hidden, heads, hiddens) for v in value]
            if all(n is not None for n in news):
                out[name] = type(value)(news)
            elif hidden and len(value) > 1 and sum(value) == hidden:
                # parts of the hidden size (Reformer's axial_pos_embds_dim): rescaled
                out[name] = type(value)(_rescale_sections(list(value), min(hidden, HIDDEN)))
    # value heads of linear attention: the ratio to their key heads
    for name, value in values.items():
        if _VALUE_HEADS.search(name) and _int(value) and value > 0:
            key_name = name.replace("value", "key")
            key, new_key = values.get(key_name), out.get(key_name, values.get(key_name))
            if _int(key) and key > 0 and value % key == 0:
                out[name] = min(new_key * (value // key), 2 * HEADS)
            else:
                out[name] = min(value, 2)
    # top-k left unset by the defaults while there are experts
    if any(_EXPERTS.match(k) and _int(v) for k, v in values.items()):
        for name, value in values.items():
            if _TOP_K.match(name) and value is None:
                out[name] = TOP_K
    _keep_sums(values, out)


#: A head dim that is the sum of two others stays their sum (MLA: nope + rope).
_SUMS = (
    ("qk_head_dim", ("qk_nope_head_dim", "qk_rope_head_dim")),
    ("head_dim", ("qk_nope_head_dim", "qk_rope_head_dim")),
)


def _keep_sums(old: dict[str, Any], new: dict[str, Any], fallback: dict | None = None) -> None:
    """Where ``old[total]`` was the sum of its parts, sets ``new[total]`` to the new parts' sum."""
    fallback = fallback or {}
    for total, parts in _SUMS:
        olds = [old.get(k) for k in (total, *parts)]
        news = [new.get(k, fallback.get(k, old.get(k))) for k in parts]
        if all(_int(v) for v in olds) and olds[0] == sum(olds[1:]) and all(_int(v) for v in news):
            new[total] = sum(news)


def _shrink_ssm(values: dict[str, Any], out: dict[str, Any]) -> None:
    for name, value in values.items():
        if name in out or not _int(value) or value <= 0:
            continue
        if _STATE.match(name):
            out[name] = min(value, STATE)
        elif _CONV.search(name.lower()):
            out[name] = min(value, CONV)
        elif _SSM_GROUPS.match(name):
            out[name] = min(value, SSM_GROUPS)
    expand = next((values[k] for k in values if _EXPAND.match(k) and values[k]), None)
    if expand is None:
        return
    hidden = out.get("hidden_size", values.get("hidden_size"))
    inner = out.get("mamba_d_ssm") or (int(expand * hidden) if hidden else None)
    head_dims = [k for k in values if _SSM_HEAD_DIM.match(k)]
    heads = [k for k in values if _SSM_HEADS.match(k)]
    if "num_attention_heads" not in values and "num_heads" in values:
        heads.append("num_heads")
        head_dims += [k for k in ("head_dim",) if k in values]
    if not inner or not heads:
        return
    for name in head_dims:
        if _int(values[name]):
            out[name] = min(values[name], HEAD_DIM)
    head_dim = next((out[k] for k in head_dims if k in out), None)
    for name in heads:
        if head_dim:
            out[name] = max(inner // head_dim, 1)
        else:  # the config derives the head dim from the heads (Zamba 2)
            old_inner = values.get("mamba_d_ssm") or int(expand * values["hidden_size"])
            old_dim = old_inner // values[name] if values[name] else HEAD_DIM
            out[name] = max(inner // min(old_dim, HEAD_DIM), 1)
    groups = [k for k in values if _SSM_GROUPS.match(k)]
    for name in groups:
        group = out.get(name, values[name])
        for head_name in heads:
            if _int(group) and out[head_name] % group:
                out[name] = 1


def _shrink_moe(values: dict[str, Any], out: dict[str, Any]) -> None:
    for name, value in values.items():
        if name in out or not _int(value) or value <= 0:
            continue
        if _EXPERTS.match(name):
            out[name] = min(value, EXPERTS)
        elif _TOP_K.match(name):
            out[name] = min(value, TOP_K)
        elif _EXPERT_GROUPS.match(name):
            out[name] = min(value, 2)
        elif _TOPK_GROUP.match(name) or _SHARED_EXPERTS.match(name):
            out[name] = 1


def _shrink_positions(values: dict[str, Any], out: dict[str, Any]) -> None:
    main_old = values.get("max_position_embeddings")
    main_new = main_old
    for name, value in values.items():
        if name in out or not _int(value) or value <= 0:
            continue
        if _POSITIONS.match(name):
            new = min(max(value, MIN_POSITIONS), MAX_POSITIONS)
            if new != value:
                out[name] = new
                if name == "max_position_embeddings":
                    main_new = new
    for name, value in values.items():
        if name in out or not _int(value) or value <= 0:
            continue
        if _WINDOW.match(name) and _int(main_old) and main_old > 0 and value >= main_old:
            out[name] = main_new  # a window over every position stays so (it never slides)
        elif _WINDOW.match(name) and value > WINDOW:
            out[name] = WINDOW
        elif _CHUNK.match(name) and value > CHUNK:
            out[name] = CHUNK
    for name, value in values.items():
        if _ORIGINAL_POSITIONS.match(name) and _int(value) and _int(main_old) and main_old > 0:
            out[name] = max(value * main_new // main_old, 1)


def _shrink_rope(rope: Any, old_dim: int | None, new_dim: int, main_old: Any, main_new: Any) -> Any:
    """RoPE parameters (maybe one dict per layer type) for the new head dim and positions."""
    if not isinstance(rope, dict):
        return rope
    if all(isinstance(v, dict) or v is None for v in rope.values()) and rope:
        return {k: _shrink_rope(v, old_dim, new_dim, main_old, main_new) for k, v in rope.items()}
    out = dict(rope)
    factor = rope.get("partial_rotary_factor") or 1.0
    old_half = int(old_dim * factor) // 2 if old_dim else None
    new_half = int(new_dim * factor) // 2
    for key, value in rope.items():
        if key in ("original_max_position_embeddings", "max_position_embeddings"):
            if _int(value) and _int(main_old) and main_old > 0 and _int(main_new):
                scaled = max(value * main_new // main_old, 1)
                out[key] = scaled if key.startswith("original") else main_new
        elif isinstance(value, list) and value and old_half:
            if len(value) == old_half:
                out[key] = value[:new_half]
            elif all(_int(v) for v in value) and sum(value) == old_half:
                out[key] = _rescale_sections(value, new_half)
    return out


def _rescale_sections(sections: list[int], total: int) -> list[int]:
    """Integer sections proportional to ``sections`` summing to ``total`` (each at least 1)."""
    old = sum(sections)
    scaled = [max(1, s * total // old) for s in sections]
    scaled[-1] += total - sum(scaled)
    return scaled


# --- vocabulary and special tokens ----------------------------------------------------------------


def _token_values(value: Any) -> Iterable[int]:
    if _int(value):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _token_values(v)


def _remap_tokens(value: Any, mapping: dict[int, int]) -> Any:
    if _int(value):
        return mapping.get(value, value)
    if isinstance(value, (list, tuple)):
        return type(value)(_remap_tokens(v, mapping) for v in value)
    return value


def _shrink_vocab(values: dict[str, Any], out: dict[str, Any], vocab: int | None) -> int | None:
    old_vocab = values.get("vocab_size")
    for name, value in values.items():
        if name in out or not _int(value) or value <= 0:
            continue
        if _VOCAB.search(name) and value > VOCAB:
            out[name] = VOCAB
        elif _int(old_vocab) and old_vocab > VOCAB and value == old_vocab:
            out[name] = VOCAB  # a field that is the vocabulary size (``vocab_offset``)
    new_vocab = out.get("vocab_size", values.get("vocab_size", vocab))
    if not _int(new_vocab):
        return vocab
    token_fields = {k: v for k, v in values.items() if _TOKEN_ID.search(k) and v is not None}
    used = {t for v in token_fields.values() for t in _token_values(v) if 0 <= t < new_vocab}
    high = sorted({t for v in token_fields.values() for t in _token_values(v) if t >= new_vocab})
    mapping, candidate = {}, new_vocab - 1
    for token in high:
        while candidate in used:
            candidate -= 1
        mapping[token] = candidate
        used.add(candidate)
    for name, value in token_fields.items():
        remapped = _remap_tokens(value, mapping)
        if remapped != value:
            out[name] = remapped
    return new_vocab


# --- entry points ---------------------------------------------------------------------------------


def _values(config: Any) -> dict[str, Any]:
    """The config's constructor fields with their values (as ``to_dict`` gives them)."""
    names = [*_field_names(config), "per_layer_config"]
    aliases = {real: alias for alias, real in getattr(config, "attribute_map", {}).items()}
    serialized = {aliases.get(k, k): v for k, v in config.to_dict().items()}
    values = {}
    if isinstance(serialized.get("per_layer_config"), dict):
        values["per_layer_config"] = serialized["per_layer_config"]
    for name in names:
        if name in values:
            continue
        try:
            values[name] = getattr(config, name)
        except AttributeError:
            continue
        except Exception:  # a heterogeneous config refuses a global per-layer read
            if name in serialized:
                values[name] = serialized[name]
    return values


def _derived(config: Any) -> set[str]:
    """Fields the config computes itself (``head_dim``, ``num_key_value_heads``, …).

    Those whose declared default is ``None`` and whose value is the one the class computes from
    its defaults (a value given explicitly, ``LlamaConfig(num_key_value_heads=1)``, is not).
    """
    if not dataclasses.is_dataclass(config):
        return set()
    try:
        defaults = type(config)()
    except Exception:  # a class without defaults for everything: every such field is derived
        defaults = config
    return {
        f.name
        for f in dataclasses.fields(config)
        if f.default is None
        and _get(config, f.name) is not None
        and repr(_get(config, f.name)) == repr(_get(defaults, f.name))
    }


def _get(config: Any, name: str) -> Any:
    try:
        return getattr(config, name, None)
    except Exception:  # a heterogeneous config refuses some global reads
        return "refused"


def shrink(
    config: Any,
    *,
    layers: int = 2,
    vocab: int | None = None,
    overrides: dict[str, Any] | None = None,
    hiddens: frozenset[int] = frozenset(),
) -> Any:
    """A tiny copy of ``config`` (a ``PretrainedConfig``) by the module's rules.

    Args:
        config: The config to shrink (usually a class's defaults).
        layers: Layer count (more where needed to keep every per-layer kind).
        vocab: The enclosing config's vocabulary, for token ids of a config without one.
        overrides: Fields set after the rules (and :data:`OVERRIDES`).
        hiddens: The enclosing configs' hidden sizes: a width equal to one becomes the tiny one.

    Returns:
        A new config of the same class.
    """
    values = _values(config)
    subs = _sub_configs(config)
    hiddens = frozenset(
        {*hiddens}
        | {
            v
            for c in (config, *subs.values())
            for k in _MAIN_HIDDEN
            if _int(v := _get(c, k)) and v > HIDDEN
        }
    )
    out: dict[str, Any] = {}
    main = _shrink_layers(values, layers, out)
    layer_fields = [k for k in out if not _LAYER_COUNT.match(k)]
    _shrink_layer_scalars(values, main, out)
    _shrink_widths(values, out, hiddens)
    _shrink_ssm(values, out)
    _shrink_moe(values, out)
    _shrink_positions(values, out)
    own_vocab = _shrink_vocab(values, out, vocab)
    if "per_layer_config" in values and isinstance(values["per_layer_config"], dict):
        out["per_layer_config"] = _shrink_per_layer(
            out.get("per_layer_config", values["per_layer_config"]), values, out
        )
    for name in ("rope_parameters", "rope_scaling"):
        if isinstance(values.get(name), dict):
            old_dim = values.get("head_dim") or _div(
                values.get("hidden_size"), values.get("num_attention_heads")
            )
            new_dim = out.get("head_dim") or _div(
                out.get("hidden_size", values.get("hidden_size")),
                out.get("num_attention_heads", values.get("num_attention_heads")),
            )
            out[name] = _shrink_rope(
                values[name],
                old_dim,
                new_dim or HEAD_DIM,
                values.get("max_position_embeddings"),
                out.get("max_position_embeddings", values.get("max_position_embeddings")),
            )
    text_vocab = own_vocab
    for name, sub in subs.items():
        if "text" in name or "decoder" in name:
            sub_vocab = getattr(sub, "vocab_size", None)
            text_vocab = text_vocab or (min(sub_vocab, VOCAB) if _int(sub_vocab) else None)
    for name, sub in subs.items():
        out[name] = shrink(sub, layers=layers, vocab=text_vocab, hiddens=hiddens)
    if own_vocab is None and text_vocab is not None:
        _shrink_vocab({k: v for k, v in values.items() if k not in out}, out, text_vocab)
    for name, value in values.items():  # a default left unset among its choices (Xmod)
        choices = values.get(name.removeprefix("default_") + "s")
        named = isinstance(choices, (list, tuple)) and all(isinstance(c, str) for c in choices)
        if name.startswith("default_") and value is None and named and choices:
            out[name] = choices[0]
    explicit = {**OVERRIDES.get(getattr(config, "model_type", ""), {}), **(overrides or {})}
    out.update(explicit)
    # A derived field is left to the config unless it holds the layer structure (a per-layer list).
    derived = _derived(config) - set(layer_fields) - set(subs) - set(explicit)
    kwargs = {k: v for k, v in out.items() if k not in _SKIP and k not in derived}
    tiny = type(config)(**kwargs)
    kinds = _layer_kinds(tiny, values, set(explicit))
    return type(config)(**{**kwargs, **kinds}) if kinds else tiny


_ATTENTION_INDICES = re.compile(r"^(attn|attention|full_attn)_\w*(indices|idxs|ids)$")
_STATE_KIND = "linear_attention"
_ATTENTION_KIND = "full_attention"


def _layer_kinds(tiny: Any, values: dict[str, Any], explicit: set[str]) -> dict[str, Any]:
    """Fields that give a hybrid's tiny config both kinds of layer, or ``{}``.

    - A hybrid whose defaults are all state layers (``layer_types`` all ``linear_attention``)
      while it has attention heads (Bamba, GraniteMoeHybrid: the real checkpoints set attention
      layers): its last layer becomes full attention, through the config's own field, the
      kinds list itself or the attention-layer index list it is derived from
      (``attn_layer_indices``).
    - A ``layer_types`` the config leaves ``None`` and does not derive (LFM2-MoE: transformers'
      defaults do not build): the state kinds its modeling module compares ``layer_types``
      with (``!= "conv"``), then full attention, cycled over the layer count.
    """
    names = set(_field_names(tiny))
    if "layer_types" in explicit:
        return {}
    kinds = _get(tiny, "layer_types")
    count = _get(tiny, "num_hidden_layers")
    if not _int(count) or count <= 0:
        return {}
    if kinds is None and "layer_types" in names:
        found = _compared_state_kinds(tiny)
        if not found:
            return {}
        pattern = [*found, _ATTENTION_KIND]
        count = max(count, len(pattern))
        return {
            "layer_types": [pattern[i % len(pattern)] for i in range(count)],
            "num_hidden_layers": count,
        }
    heads = _get(tiny, "num_attention_heads")
    if not (isinstance(kinds, list) and kinds and set(kinds) == {_STATE_KIND}):
        return {}
    if not (_int(heads) and heads > 0):
        return {}
    if "layer_types" in names and isinstance(values.get("layer_types"), list):
        return {"layer_types": [*kinds[:-1], _ATTENTION_KIND]}
    for name in sorted(names):
        if _ATTENTION_INDICES.match(name) and values.get(name) is None and name not in explicit:
            return {name: [len(kinds) - 1]}
    return {}


def _compared_state_kinds(config: Any) -> list[str]:
    """The state-layer kinds the config's modeling module compares ``layer_types[…]`` with."""
    import importlib
    import inspect

    from transformers import cache_utils

    # transformers 4.x types no cache layers by kind: no kind is known to be a state kind.
    mapping = getattr(cache_utils, "DYNAMIC_LAYER_TYPE_MAPPING", None)
    state_layer = getattr(cache_utils, "LinearAttentionCacheLayerMixin", None)
    if mapping is None or state_layer is None:
        return []
    module_name = type(config).__module__.replace(".configuration_", ".modeling_")
    try:
        source = inspect.getsource(importlib.import_module(module_name))
    except (ImportError, OSError, TypeError):
        return []
    literals = re.findall(r"layer_types\[[^\]]*\]\s*[!=]=\s*[\"'](\w+)[\"']", source)
    return [
        kind
        for kind in dict.fromkeys(literals)
        if kind in mapping and issubclass(mapping[kind], state_layer)
    ]


def _div(a: Any, b: Any) -> int | None:
    return a // b if _int(a) and _int(b) and b else None


def _shrink_per_layer(
    per_layer: dict[Any, dict[str, Any]], values: dict[str, Any], out: dict[str, Any]
) -> dict[Any, dict[str, Any]]:
    """Per-layer overrides keep their ratio to the global value they override."""
    shrunk = {}
    for layer, overrides in per_layer.items():
        new = {}
        for key, value in overrides.items():
            base, new_base = values.get(key), out.get(key, values.get(key))
            scaled = _ratio(value, base, new_base) if _int(base) and _int(new_base) else None
            if scaled is None and _int(value) and _int(base) and base:
                scaled = max(1, round(value * new_base / base))
            new[key] = scaled if scaled is not None else value
        layer_old = {**values, **overrides}
        layer_new = {k: v for k, v in new.items()}
        _keep_sums(layer_old, layer_new, fallback=out)
        for total, _ in _SUMS:
            if total in layer_new and total not in overrides:
                if layer_new[total] != out.get(total, values.get(total)):
                    out[total] = layer_new[total]  # the global value serves this layer
            elif total in layer_new:
                new[total] = layer_new[total]
        shrunk[layer] = new
    return shrunk


def tiny_config(model_type: str, *, layers: int = 2, **overrides: Any) -> Any:
    """The tiny config of a transformers ``model_type``, derived from its class's defaults.

    Args:
        model_type: A key of transformers' ``CONFIG_MAPPING`` (``"llama"``, ``"jamba"``, …).
        layers: Layer count (more where needed to keep every per-layer kind).
        **overrides: Fields set after the rules (and before validation).

    Returns:
        A ``PretrainedConfig`` of the type's class.
    """
    from transformers import AutoConfig

    return shrink(AutoConfig.for_model(model_type), layers=layers, overrides=overrides)


def tiny_model(
    model_type: str,
    *,
    auto_class: str = "AutoModelForCausalLM",
    layers: int = 2,
    seed: int = 0,
    config: Any = None,
    prepare: Callable[[Any], Any] | None = None,
) -> Any:
    """A tiny model with random weights (``torch.manual_seed(seed)``), in eval mode.

    A weight matrix the model initializes to one value (a zero router gate) is re-drawn at
    random (:func:`_break_constant_matrices`): its ties would be decided by the kernel.

    Args:
        model_type: A transformers ``model_type``.
        auto_class: The ``transformers`` auto class that builds it.
        layers: Passed to :func:`tiny_config`.
        seed: The weights' seed.
        config: A config to use instead of :func:`tiny_config`'s.
        prepare: Called on the config before the model is built (returns it).

    Returns:
        The model.
    """
    import torch
    import transformers

    cfg = config if config is not None else tiny_config(model_type, layers=layers)
    if prepare is not None:
        cfg = prepare(cfg)
    torch.manual_seed(seed)
    model = getattr(transformers, auto_class).from_config(cfg).eval()
    _break_constant_matrices(model, seed)
    return model


def _break_constant_matrices(model: Any, seed: int) -> None:
    """Re-draws every weight matrix (2-D or more) whose entries are all one value.

    Some models initialize a matrix to a constant (an MoE router gate to zeros, as a trained
    checkpoint never is): every score it yields ties, and which of tied experts ``topk`` picks
    is the kernel's choice (PyTorch and onnxruntime pick differently), not the model's. Such a
    matrix gets normal(0, 0.02) entries from its own seeded generator, so the tiny model's ids
    are decided by the model. Vectors (norm scales, biases) are left as they are.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2 and parameter.numel() > 1 and parameter.is_floating_point():
                flat = parameter.reshape(-1)
                if bool((flat == flat[0]).all()):
                    noise = torch.randn(parameter.shape, generator=generator) * 0.02
                    parameter.copy_(noise.to(parameter.dtype))


__all__ = ["OVERRIDES", "shrink", "tiny_config", "tiny_model"]
