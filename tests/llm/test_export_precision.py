"""``irkit export --precision``: int4/int8 (``irkit.quantize`` on the weightless model before
the streamed save) and fp16 (``irkit.llm._precision``: the meta model in float16, the fp32
checkpoint converted while streamed).

A tiny random-weight llama folder is exported; the folder's ``model.onnx`` is run in
onnxruntime against eager PyTorch (same random inputs, a past of 4 and 8 new tokens), its op
histogram is checked, and onnxruntime-genai's ``Generator`` runs it greedily.
"""

from __future__ import annotations

import collections
import json
import pathlib

import numpy as np
import onnx
import onnx.inliner
import pytest

from irkit.errors import LoweringOptionsError
from irkit.llm import causal_lm_feeds, export, run_eager

og = pytest.importorskip("onnxruntime_genai")
transformers = pytest.importorskip("transformers")

LAYERS = 2


def _folder(root: pathlib.Path, tied: bool = False) -> pathlib.Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = root / ("llama-tied-hf" if tied else "llama-hf")
    if folder.exists():
        return folder
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(300)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", bos_token="t0", eos_token="t1", pad_token="t2"
    ).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> pathlib.Path:
    return _folder(tmp_path_factory.mktemp("precision"))


@pytest.fixture(scope="module")
def int4_concat(folder, tmp_path_factory) -> tuple[pathlib.Path, dict]:
    """The default int4 export (target ort) on the concatenated cache: its folder and
    genai_config (two tests read it)."""
    out = tmp_path_factory.mktemp("int4") / "concat"
    return out, export(folder, out, precision="int4", share_buffer=False).genai_config


def _histogram(path: pathlib.Path) -> dict[str, int]:
    """Op counts of the model with its local functions inlined (every call counted)."""
    model = onnx.inliner.inline_local_functions(onnx.load(str(path), load_external_data=False))
    return dict(collections.Counter(n.op_type for n in model.graph.node))


def _ort_vs_eager(folder: pathlib.Path, out: pathlib.Path) -> tuple[float, np.ndarray]:
    """(max |logits difference| / max |eager fp32 logits|, the ORT logits); float inputs are
    given to ORT in the dtype the model declares."""
    import onnxruntime as ort

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    feeds = causal_lm_feeds(model, batch=1, seq=8, past=4)
    expected = run_eager(model, feeds)[0]
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    declared = {i.name: i.type for i in session.get_inputs()}
    ort_feeds = {
        k: v.astype(np.float16) if declared[k] == "tensor(float16)" else v
        for k, v in feeds.items()
        if k in declared
    }
    got = session.run(["logits"], ort_feeds)[0].astype(np.float32)
    # (the folder's logits are the last real token's: genai's trimmed prefill logits)
    assert got.shape[1] == 1, got.shape
    return float(np.abs(got - expected[:, -1:]).max() / np.abs(expected).max()), got


def _generates(out: pathlib.Path, new_tokens: int = 8) -> list[int]:
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=4 + new_tokens, min_length=4 + new_tokens)
    generator = og.Generator(model, params)
    generator.append_tokens([3, 17, 42, 99])
    while not generator.is_done():
        generator.generate_next_token()
    return list(generator.get_sequence(0))


@pytest.mark.slow
@pytest.mark.parametrize("source", ["loaded", "folder"])
@pytest.mark.parametrize(("precision", "bits", "tolerance"), [("int4", 4, 0.1), ("int8", 8, 0.03)])
def test_int_precisions_quantize_the_matmuls(folder, tmp_path, precision, bits, tolerance, source):
    """``loaded``: a model in memory, quantized with its weights; ``folder``: the meta-device
    model, quantized weightless, packed while the weights stream from the shards (needs helper
    quant-stream's streamed quantization)."""
    out = tmp_path / precision
    model = (
        transformers.AutoModelForCausalLM.from_pretrained(folder) if source == "loaded" else folder
    )
    # the eager comparison feeds a past of 4 and 8 new tokens: the concatenated cache's contract;
    # target onnx: its quantized decode fusions (the ort default packs q/k/v and gate/up)
    result = export(model, out, precision=precision, share_buffer=False, target="onnx")
    ops = _histogram(out / "model.onnx")
    # q, k, v, o, gate, up, down per layer, and lm_head
    assert ops.get("MatMulNBits") == 7 * LAYERS + 1, ops
    assert "MatMul" not in ops and ops.get("Attention") == LAYERS, ops  # no float matmul left
    # the decode fusions of irkit.rules.decode, across the layer functions: each residual add +
    # the norm after it (inside each layer and at each seam), SiLU, the causal mask as is_causal
    assert ops.get("SkipSimplifiedLayerNormalization") == 2 * LAYERS, ops
    assert ops.get("QuickGelu") == LAYERS and "Sigmoid" not in ops, ops
    assert "LessOrEqual" not in ops and "Range" not in ops, ops
    proto = onnx.inliner.inline_local_functions(
        onnx.load(str(out / "model.onnx"), load_external_data=False)
    )
    widths = {
        a.i
        for n in proto.graph.node
        if n.op_type == "MatMulNBits"
        for a in n.attribute
        if a.name == "bits"
    }
    assert widths == {bits}
    error, _ = _ort_vs_eager(folder, out)
    assert error < tolerance, error
    assert result.genai_config["model"]["decoder"]["num_hidden_layers"] == LAYERS
    assert len(_generates(out)) == 12


def test_unknown_precision(tmp_path):
    with pytest.raises(LoweringOptionsError, match="precision 'int3' is not one of"):
        export(tmp_path, tmp_path / "out", precision="int3")


@pytest.mark.slow
def test_fp16_export(folder, tmp_path):
    fp32 = export(folder, tmp_path / "fp32", share_buffer=False)
    fp16 = export(folder, tmp_path / "fp16", precision="fp16", share_buffer=False)
    proto = onnx.load(str(tmp_path / "fp16" / "model.onnx"), load_external_data=False)
    inputs = {i.name: i.type.tensor_type.elem_type for i in proto.graph.input}
    outputs = {o.name: o.type.tensor_type.elem_type for o in proto.graph.output}
    assert inputs["past_key_values.0.key"] == onnx.TensorProto.FLOAT16
    assert outputs["present.0.value"] == onnx.TensorProto.FLOAT16
    assert fp16.kv_cache_bytes * 2 == fp32.kv_cache_bytes
    weights = [i for i in proto.graph.initializer if len(i.dims) == 2]
    assert weights and {i.data_type for i in weights} == {onnx.TensorProto.FLOAT16}
    assert (tmp_path / "fp16" / "model.onnx.data").stat().st_size * 2 == pytest.approx(
        (tmp_path / "fp32" / "model.onnx.data").stat().st_size, rel=0.01
    )
    error, _ = _ort_vs_eager(folder, tmp_path / "fp16")
    assert error < 0.01, error
    assert len(_generates(tmp_path / "fp16")) == 12


@pytest.mark.slow
def test_int4_on_the_shared_buffer_generates_as_concatenated(folder, tmp_path, int4_concat):
    """The default (target ort, shared KV buffer) quantized: genai's ids equal the concatenated
    cache's, token for token."""
    export(folder, tmp_path / "shared", precision="int4")
    config = json.loads((tmp_path / "shared" / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True
    assert _generates(tmp_path / "shared") == _generates(int4_concat[0])


def test_execution_provider_choices():
    """fp32 on CUDA is refused before anything is read (its attention would run on the CPU);
    the command line offers the same providers as the API."""
    from irkit.cli._export import _PROVIDERS
    from irkit.llm._provider import ExecutionProvider

    assert tuple(p.value for p in ExecutionProvider) == _PROVIDERS
    absent = pathlib.Path("absent")
    with pytest.raises(LoweringOptionsError, match="GroupQueryAttention computes in float16"):
        export(absent, "out", execution_provider="cuda")
    with pytest.raises(LoweringOptionsError, match="execution provider 'rocm' is not one of"):
        export(absent, "out", execution_provider="rocm")


@pytest.mark.slow
def test_cuda_folders_compute_in_fp16(folder, tmp_path, int4_concat):
    """``execution_provider="cuda"``: genai_config names CUDA and the graph is float16 (int4:
    float16 activations and scales beside the packed weights; the ops of the CPU's model but
    for the residual adds fused into the norms; ``fp16`` takes the same path).
    Run here on the CPU (genai's providers cleared): near eager, and genai generates."""
    cpu_folder, cpu_config = int4_concat
    cuda = export(
        folder,
        tmp_path / "cuda",
        precision="int4",
        share_buffer=False,
        execution_provider="cuda",
    )
    options = cuda.genai_config["model"]["decoder"]["session_options"]["provider_options"]
    assert options == [{"cuda": {}}]
    assert cpu_config["model"]["decoder"]["session_options"]["provider_options"] == []
    ops = _histogram(tmp_path / "cuda" / "model.onnx")
    cpu_ops = _histogram(cpu_folder / "model.onnx")
    # for CUDA every residual add + RMS norm is one SkipSimplifiedLayerNormalization: inside
    # each layer, and at each seam of two layers (or of the last and the final norm), between
    # the layer calls (docs/fusion_across_modules.md)
    assert ops.get("SkipSimplifiedLayerNormalization") == 2 * LAYERS, ops
    assert cpu_ops["Add"] - ops.get("Add", 0) == 2 * LAYERS, (ops, cpu_ops)
    assert cpu_ops["RMSNormalization"] - ops.get("RMSNormalization", 0) == 2 * LAYERS
    # else the same ops, but for the Casts of float16's float32 islands (the norms' statistics)
    fused = {"SkipSimplifiedLayerNormalization", "Add", "RMSNormalization", "Cast"}
    assert {op for op in ops.keys() | cpu_ops.keys() if ops.get(op) != cpu_ops.get(op)} <= fused
    proto = onnx.inliner.inline_local_functions(
        onnx.load(str(tmp_path / "cuda" / "model.onnx"), load_external_data=False)
    )
    inputs = {i.name: i.type.tensor_type.elem_type for i in proto.graph.input}
    assert inputs["past_key_values.0.key"] == onnx.TensorProto.FLOAT16
    dtypes = {i.name: i.data_type for i in proto.graph.initializer}
    weights = {
        dtypes[n.input[2 if n.op_type == "MatMulNBits" else 1]]
        for n in proto.graph.node
        if n.op_type in ("MatMulNBits", "MatMul") and n.input[-1] in dtypes
    }
    assert weights == {onnx.TensorProto.FLOAT16}  # MatMulNBits' scales (int4), MatMul's weights
    levels = {
        a.i
        for n in proto.graph.node
        if n.op_type == "MatMulNBits"
        for a in n.attribute
        if a.name == "accuracy_level"
    }
    assert levels <= {0}, levels  # unset, as the builder's -e cuda (the CPU's default is 4)
    error, _ = _ort_vs_eager(folder, tmp_path / "cuda")
    assert error < 0.1, error
    config = og.Config(str(tmp_path / "cuda"))
    config.clear_providers()
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=12, min_length=12)
    generator = og.Generator(model, params)
    generator.append_tokens([3, 17, 42, 99])
    while not generator.is_done():
        generator.generate_next_token()
    assert len(generator.get_sequence(0)) == 12


def _qwen35_folder(root: pathlib.Path) -> pathlib.Path:
    """A tiny Qwen3.5 (one gated-delta-net layer, one attention layer), the llama folder's
    tokenizer."""
    import torch

    folder = root / "qwen35-hf"
    config = transformers.Qwen3_5TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=300,
        layer_types=["linear_attention", "full_attention"], bos_token_id=0, eos_token_id=1,
        pad_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    llama = _folder(root)
    for path in llama.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens")):
            (folder / path.name).write_bytes(path.read_bytes())
    return folder


#: The CPU fp16 graph of the tiny Qwen3.5 (``_qwen35_folder``), op → count: what the CUDA graph
#: changes is counted from it (one CPU export, made while writing the test, not in every run).
_QWEN35_CPU_FP16 = {  # (with the last-token logits' gather: irkit.llm._logits)
    "Add": 6, "And": 1, "Attention": 1, "Cast": 29, "CausalConvWithState": 1, "Concat": 3,
    "Cos": 1, "Exp": 1, "Expand": 4, "FusedMatMul": 9, "Gather": 3, "GatherElements": 1,
    "GatherND": 1, "Greater": 1, "If": 1, "LessOrEqual": 1, "LinearAttention": 1,
    "LinearAttentionGate": 1, "MatMul": 2, "Max": 1, "Mul": 11, "Neg": 4, "RMSNormalization": 10,
    "Range": 3, "ReduceMin": 1, "ReduceSum": 1, "Reshape": 15, "RotaryEmbedding": 2, "Shape": 7,
    "Sigmoid": 5, "Sin": 1, "Slice": 4, "Split": 4, "Squeeze": 3, "Sub": 1, "Transpose": 6,
    "Unsqueeze": 16, "Where": 1,
}  # fmt: skip


@pytest.mark.slow  # (a Qwen3.5 export: ~15 s on two shared cores)
def test_cuda_qwen35_norms_compute_in_fp16(tmp_path):
    """Qwen3.5's norms upcast whole (``x.float()``, ``1 + w.float()``) and its gated output norm
    (the gate's SiLU in float32): on CUDA the float16 fused ops, which compute in float32
    inside (``irkit.rules.ort.half_norm``); the CPU's fp16 graph keeps the float32 islands."""
    folder = _qwen35_folder(tmp_path)
    export(
        folder, tmp_path / "cuda", precision="fp16", share_buffer=False, execution_provider="cuda"
    )  # fmt: skip
    ops, cpu_ops = _histogram(tmp_path / "cuda" / "model.onnx"), _QWEN35_CPU_FP16
    changed = {op: (cpu_ops.get(op, 0), ops.get(op, 0)) for op in ops.keys() | cpu_ops.keys()}
    changed = {op: counts for op, counts in changed.items() if counts[0] != counts[1]}
    # every norm after a residual add fuses with it (2 Casts, the Add, the norm → 1): the
    # post-attention norm of each layer, the next layer's input norm or the final one at each
    # seam; the first input norm alone (2 Casts); the gated norm (Cast ×3, Mul ×2, Sigmoid, the
    # norm → 1); the attention layer's q/k norms (2 Casts each)
    assert changed == {
        "Add": (cpu_ops["Add"], cpu_ops["Add"] - 2 * LAYERS),
        # (the scales 1 + w are folded weights, rounded to float16 once: no Cast left for them)
        "Cast": (cpu_ops["Cast"], cpu_ops["Cast"] - 2 * (2 * LAYERS + 1) - 3 - 4),
        "GatedRMSNorm": (0, 1),
        "Mul": (cpu_ops["Mul"], cpu_ops["Mul"] - 2),
        "RMSNormalization": (
            cpu_ops["RMSNormalization"],
            cpu_ops["RMSNormalization"] - 2 * LAYERS - 1,
        ),
        "Sigmoid": (cpu_ops["Sigmoid"], cpu_ops["Sigmoid"] - 1),
        "SkipSimplifiedLayerNormalization": (0, 2 * LAYERS),
    }, changed
    error, _ = _ort_vs_eager(folder, tmp_path / "cuda")
    assert error < 0.01, error


@pytest.mark.parametrize("source", ["loaded", "folder"])
def test_int4_tied_embedding_is_gathered_from_the_lm_heads_packed_weight(tmp_path, source):
    """A table tied to the lm_head: ``GatherBlockQuantized`` reads the ``MatMulNBits``' packed
    bytes (as the builder's folders do): no float copy of the table is written, the folder is
    smaller, and its logits stay within int4's tolerance of eager PyTorch."""
    folder = _folder(tmp_path, tied=True)
    model = (
        transformers.AutoModelForCausalLM.from_pretrained(folder) if source == "loaded" else folder
    )
    out = tmp_path / "int4"
    export(model, out, precision="int4", share_buffer=False)
    ops = _histogram(out / "model.onnx")
    assert ops.get("GatherBlockQuantized") == 1 and "Gather" not in ops, ops
    proto = onnx.load(str(out / "model.onnx"), load_external_data=False)
    floats = [
        i.name
        for i in proto.graph.initializer
        if i.data_type == onnx.TensorProto.FLOAT and list(i.dims) == [300, 64]
    ]
    assert floats == []  # (the 300 × 64 table only as the packed int4 bytes)
    error, _ = _ort_vs_eager(folder, out)
    assert error < 0.1, error
    assert len(_generates(out)) == 12
