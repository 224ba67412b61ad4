"""Hugging Face causal LMs with their loss computed from the hidden states, without the logits:
softlight.torch.linear_cross_entropy in place of lm_head followed by the loss.

    import softlight.transformers
    softlight.transformers.patch(model)      # this model (Llama, Mistral, Qwen2/3, Gemma 1/2/3)
    softlight.transformers.patch("llama")    # every LlamaForCausalLM, made before or after
    softlight.transformers.patch(model, memory="low_memory")   # the loss's low-memory form

A patched model, in training mode and given labels, runs its decoder (model.model), then the loss of
its lm_head over the hidden states: labels shifted as transformers shifts them (position t predicts
label t + 1; -100 ignored), the mean over the kept tokens (or the sum over num_items_in_batch, as
transformers' gradient accumulation passes it), Gemma 2/3's final_logit_softcapping applied. It
returns the loss with logits=None. In eval mode, or without labels, the model runs as it was. The
patch needs transformers (an optional extra: pip install softlight[transformers]); it reads no
transformers internals beyond the models' decoder (model.model), lm_head and config.
"""
import types

import torch

from ._errors import ArgumentTypeError, InvalidArgumentError
from ._linear import _check_memory, linear_cross_entropy

# model_type -> the causal LM class of transformers that it names.
MODELS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
          "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
          "gemma3": "Gemma3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
_PATCHED = "_softlight_original_forward"
_MEMORY = "_softlight_memory"  # the memory form a patched model's loss takes (a model's, else its class's)


def _loss(model, hidden, labels, kwargs):
    num_items = kwargs.pop("num_items_in_batch", None)
    shift_labels = kwargs.pop("shift_labels", None)
    head = model.lm_head
    softcap = getattr(model.config, "final_logit_softcapping", None)
    target, shift = (labels, True) if shift_labels is None else (shift_labels, False)
    loss = linear_cross_entropy(hidden, head.weight, target.to(hidden.device), bias=head.bias, shift=shift,
                                softcap=softcap, ignore_index=-100, memory=getattr(model, _MEMORY, "speed"),
                                reduction="mean" if num_items is None else "sum")
    if num_items is not None:
        loss = loss / (num_items.to(loss.device) if isinstance(num_items, torch.Tensor) else num_items)
    return loss


def _forward_of(original):
    def forward(self, input_ids=None, *args, labels=None, **kwargs):
        if labels is None or args or not self.training:
            return original(self, input_ids, *args, labels=labels, **kwargs)
        kwargs.pop("logits_to_keep", None)
        loss_kwargs = {k: kwargs.pop(k) for k in ("num_items_in_batch", "shift_labels") if k in kwargs}
        outputs = self.model(input_ids=input_ids, **kwargs)
        loss = _loss(self, outputs.last_hidden_state, labels, loss_kwargs)
        from transformers.modeling_outputs import CausalLMOutputWithPast
        result = CausalLMOutputWithPast(loss=loss, logits=None)
        for name in ("past_key_values", "cache", "hidden_states", "attentions"):
            value = getattr(outputs, name, None)
            if value is not None and name in CausalLMOutputWithPast.__dataclass_fields__:
                result[name] = value
        return result
    forward.__softlight__ = True
    return forward


def _class_of(model_type):
    import transformers
    if model_type not in MODELS:
        raise InvalidArgumentError(f"softlight: no patch for model type {model_type!r}; known: {', '.join(MODELS)}")
    return getattr(transformers, MODELS[model_type])


def patch(target, *, memory="speed"):
    """Patches a model (an instance of a supported causal LM) or every model of a type (its name, e.g.
    "llama"); returns what it patched. memory: the form of linear_cross_entropy the loss takes,
    "speed" (the default) or "low_memory" (docs/consumers.md); a model's own choice comes before its
    type's. Patching again sets memory and changes nothing else."""
    _check_memory(memory)
    if isinstance(target, str):
        cls = _class_of(target)
        if not getattr(cls.forward, "__softlight__", False):
            setattr(cls, _PATCHED, cls.forward)
            cls.forward = _forward_of(cls.forward)
        setattr(cls, _MEMORY, memory)
        return cls
    if not isinstance(target, torch.nn.Module) or not hasattr(target, "config"):
        raise ArgumentTypeError(f"softlight: patch takes a transformers model or a model type's name, got "
                                f"{type(target).__qualname__}")
    cls = _class_of(getattr(target.config, "model_type", None))
    if not isinstance(target, cls):
        raise InvalidArgumentError(f"softlight: patch takes a {cls.__name__} for model type "
                                   f"{target.config.model_type!r}, got {type(target).__qualname__}")
    if not getattr(target.forward, "__softlight__", False):
        target.forward = types.MethodType(_forward_of(type(target).forward), target)
    setattr(target, _MEMORY, memory)
    return target


def unpatch(target):
    """Undoes patch(target)."""
    if isinstance(target, str):
        cls = _class_of(target)
        if _PATCHED in cls.__dict__:
            cls.forward = cls.__dict__[_PATCHED]
            delattr(cls, _PATCHED)
        if _MEMORY in cls.__dict__:
            delattr(cls, _MEMORY)
        return cls
    for name in ("forward", _MEMORY):
        if name in vars(target):
            delattr(target, name)
    return target


__all__ = ["patch", "unpatch", "MODELS"]
