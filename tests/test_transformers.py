"""softlight.transformers.patch on tiny random Hugging Face causal LMs built from their configs (no
download), float32 on the CPU (and on a GPU, bfloat16, where there is one): the patched model's loss
and the gradients of every parameter equal the unpatched model's."""
import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is an optional extra "
                                   "(pip install softlight[transformers])")

import softlight.transformers as slx  # noqa: E402

SMALL = dict(vocab_size=301, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, head_dim=8)
CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {}),
    "gemma2": ("Gemma2Config", dict(final_logit_softcapping=3.0, attn_logit_softcapping=50.0,
                                   query_pre_attn_scalar=8)),
    "gemma3_text": ("Gemma3TextConfig", dict(final_logit_softcapping=3.0, query_pre_attn_scalar=8)),
}


def _model(kind, device, dtype):
    name, extra = CONFIGS[kind]
    config = getattr(transformers, name)(**SMALL, **extra)
    cls = getattr(transformers, slx.MODELS[kind])
    torch.manual_seed(0)
    return cls(config).to(device=device, dtype=dtype).train()


def _step(model, ids, labels, **kw):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, **kw)
    out.loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _data(device):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 301, (2, 12), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100
    return ids.to(device), labels.to(device)


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_patched_model_gives_the_same_loss_and_gradients(kind, memory):
    plain = _model(kind, "cpu", torch.float32)
    patched = slx.patch(copy.deepcopy(plain), memory=memory)
    ids, labels = _data("cpu")
    for kw in ({}, {"num_items_in_batch": torch.tensor(17)}):
        want, wg = _step(plain, ids, labels, **kw)
        got, gg = _step(patched, ids, labels, **kw)
        assert got.logits is None and want.logits is not None
        assert torch.allclose(got.loss, want.loss, rtol=1e-5, atol=1e-6), (got.loss, want.loss)
        assert gg.keys() == wg.keys()
        for name in wg:
            assert torch.allclose(gg[name], wg[name], rtol=1e-4, atol=1e-6), (name, (gg[name] - wg[name]).abs().max())
    patched.eval()  # eval: the model as it was, logits and all
    with torch.no_grad():
        out = patched(input_ids=ids, labels=labels)
    assert out.logits is not None


def test_patch_by_model_type_and_unpatch():
    cls = slx.patch("llama")
    try:
        assert slx.patch("llama") is cls  # twice: the same
        model = _model("llama", "cpu", torch.float32)
        ids, labels = _data("cpu")
        assert model(input_ids=ids, labels=labels).logits is None
    finally:
        slx.unpatch("llama")
    assert model(input_ids=ids, labels=labels).logits is not None


def test_the_memory_form_is_the_models_else_its_types(monkeypatch):
    """patch(..., memory=) reaches linear_cross_entropy: a model's choice before its type's, set
    again by patching again, gone with unpatch."""
    seen = []
    real = slx.linear_cross_entropy

    def spy(*args, **kw):
        seen.append(kw["memory"])
        return real(*args, **kw)
    monkeypatch.setattr(slx, "linear_cross_entropy", spy)
    ids, labels = _data("cpu")
    model = _model("llama", "cpu", torch.float32)
    try:
        slx.patch("llama", memory="low_memory")
        model(input_ids=ids, labels=labels)
        slx.patch(model)
        model(input_ids=ids, labels=labels)
        slx.patch(model, memory="low_memory")
        model(input_ids=ids, labels=labels)
        slx.unpatch(model)
        model(input_ids=ids, labels=labels)  # the type's patch, its memory
    finally:
        slx.unpatch("llama")
    assert seen == ["low_memory", "speed", "low_memory", "low_memory"]
    assert model(input_ids=ids, labels=labels).logits is not None and len(seen) == 4


def test_patch_refuses_what_it_does_not_know():
    from softlight import InvalidArgumentError
    with pytest.raises(InvalidArgumentError):
        slx.patch("gpt2")
    with pytest.raises(InvalidArgumentError, match="memory"):
        slx.patch(_model("llama", "cpu", torch.float32), memory="fast")
    with pytest.raises(TypeError):
        slx.patch(torch.nn.Linear(2, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_patched_model_on_the_gpu_in_bfloat16(kind):
    """bfloat16 on the GPU: the loss within bfloat16's rounding of the unpatched model's, every
    gradient normwise within 2 %."""
    plain = _model(kind, "cuda", torch.bfloat16)
    patched = slx.patch(copy.deepcopy(plain))
    ids, labels = _data("cuda")
    want, wg = _step(plain, ids, labels)
    got, gg = _step(patched, ids, labels)
    assert torch.allclose(got.loss.float(), want.loss.float(), rtol=1e-2)
    for name in wg:
        err = (gg[name].float() - wg[name].float()).norm() / wg[name].float().norm().clamp_min(1e-30)
        assert err < 2e-2, (name, float(err))
