from irkit import metadata as md


def test_scope_roundtrip_and_call_id():
    frames = (
        md.Frame("layers.0", 0, "pkg.mod.Block"),
        md.Frame("layers.0.attn", 2, "pkg.mod.Attn"),
    )
    text = md.encode_scope(frames)
    assert md.decode_scope(text) == frames
    assert frames[1].call_id == "layers.0.attn@2"
    assert frames[0].call_id == "layers.0"
    assert md.node_scope({md.SCOPE: text}) == frames
    assert md.decode_scope(None) == () and md.decode_scope("") == ()


def test_frame_package_and_class_name():
    f = md.Frame("model.layers.0", 0, "transformers.models.llama.modeling_llama.LlamaDecoderLayer")
    assert f.package == "transformers.models.llama"
    assert f.class_name == "LlamaDecoderLayer"
    assert md.Frame("a", 0, "__main__.A").package == "__main__"


def test_every_key_has_the_prefix():
    keys = [
        getattr(md, k) for k in md.__all__ if k.isupper() and k not in ("PREFIX", "MODEL_PRODUCER")
    ]
    assert keys and all(k.startswith(md.PREFIX) for k in keys)
    assert len(set(keys)) == len(keys)
