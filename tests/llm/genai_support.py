"""Shared helpers of the onnxruntime-genai tests: a local tokenizer, model folders, genai and
transformers greedy ids.

The tokenizer is a byte-level BPE trained here with ``tokenizers`` (never downloaded), with a
chat template; :func:`save_folder` writes a model and it with ``save_pretrained``;
:func:`genai_ids` runs a folder in onnxruntime-genai's ``Generator`` (CPU, greedy, right-padded
batch, as genai pads it) and :func:`reference_ids` runs transformers ``generate`` on the same
prompts left-padded. onnxruntime_genai, transformers and tokenizers are imported on use.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

TEXT = ["hello world, the quick brown fox jumps over the lazy dog"] * 20 + ["user assistant"] * 5
CHAT = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
#: The special tokens in id order of the tokenizer test_export.py uses (<s> 0, </s> 1, <pad> 2).
SPECIALS = ("<s>", "</s>", "<pad>")


def tokenizer(
    vocab_size: int = 300, specials: Sequence[str] = SPECIALS, chat_template: str = CHAT
) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on :data:`TEXT`.

    Args:
        vocab_size: Vocabulary size (at least 256 bytes + the specials).
        specials: The special tokens ``<s>``, ``</s>``, ``<pad>`` in the id order wanted (they
            take the first ids).
        chat_template: The Jinja chat template.
    """
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXT, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = chat_template
    return fast


def save_folder(folder: pathlib.Path, model: Any, tok: Any) -> pathlib.Path:
    """``model.save_pretrained(folder)`` and ``tok.save_pretrained(folder)``; returns ``folder``."""
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def genai_ids(out: pathlib.Path, prompts: Sequence[str], new_tokens: int) -> list[list[int]]:
    """The ids onnxruntime-genai's ``Generator`` produces after each prompt (greedy, CPU).

    genai right-pads the batch: each sequence is the prompt, pads up to the longest prompt,
    then the new tokens; the new tokens are returned.
    """
    import onnxruntime_genai as og

    model = og.Model(str(out))
    tok = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    longest = max(len(tok.encode(p)) for p in prompts)
    params.set_search_options(
        max_length=longest + new_tokens, do_sample=False, batch_size=len(prompts)
    )
    generator = og.Generator(model, params)
    generator.append_tokens(tok.encode_batch(list(prompts)))
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(i)][longest:] for i in range(len(prompts))]


def reference_ids(
    folder: pathlib.Path, prompts: Sequence[str], new_tokens: int, model: Any = None
) -> list[list[int]]:
    """transformers ``generate`` (greedy) on the left-padded prompts: the new ids per prompt."""
    import torch
    import transformers

    if model is None:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    model = model.eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    batch = tok(list(prompts), return_tensors="pt", padding=True)
    with torch.no_grad():
        ids = model.generate(
            **batch,
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
    out: list[list[int]] = ids[:, batch["input_ids"].shape[1] :].tolist()
    return out


def until_eos(ids: Sequence[int], eos: int) -> list[int]:
    """``ids`` up to and including the first ``eos`` (all of them if there is none)."""
    ids = list(ids)
    return ids[: ids.index(eos) + 1] if eos in ids else ids
