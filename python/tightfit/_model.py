"""tightfit.Model and tightfit.plan: `tightfit grad`, `logprobs` and `plan` as calls.

Batches follow the tool's batch files (docs/tool.md), with the same checks: labels unshifted
(-100 ignored; default: input_ids), attention_mask (right padding) or lengths, position_ids for
packed documents. Arrays are numpy arrays or anything with __dlpack__ (torch CPU tensors); a 1-D
per-token array is one sequence.
"""
import os

import numpy

from . import _tightfit

# objective -> the batch-file key of each array argument (everything else is a scalar option)
_ARRAYS = {
    "sft": {"input_ids": "input_ids", "labels": "labels", "attention_mask": "attention_mask",
            "lengths": "lengths", "position_ids": "position_ids"},
    "dpo": {"input_ids": "chosen_input_ids", "labels": "chosen_labels",
            "attention_mask": "chosen_attention_mask", "position_ids": "chosen_position_ids",
            "rejected_input_ids": "rejected_input_ids", "rejected_labels": "rejected_labels",
            "rejected_attention_mask": "rejected_attention_mask",
            "rejected_position_ids": "rejected_position_ids",
            "ref_chosen_logps": "ref_chosen_logps", "ref_rejected_logps": "ref_rejected_logps"},
}
_ARRAYS["grpo"] = dict(_ARRAYS["sft"], advantages="advantages", old_logprobs="old_logprobs",
                       ref_logprobs="ref_logprobs")


def _dtype_name(dtype):
    try:
        return numpy.dtype(dtype).name
    except TypeError:
        raise ValueError(f"dtype is {dtype!r}, expected 'float32' or 'float64'") from None


def _split(objective, arguments):
    """(arrays by batch-file key, scalar options) of a call's arguments."""
    keys = _ARRAYS.get(objective, _ARRAYS["sft"])
    arrays, options = {}, {}
    for name, value in arguments.items():
        if value is None:
            continue
        if name in keys:
            arrays[keys[name]] = value
        else:
            options[name] = value
    return arrays, options


class Model:
    """A Hugging Face checkpoint (config.json + safetensors) loaded as `tightfit grad --model`
    loads it, in float32 or float64, on the CPU backend (Eigen + oneTBB)."""

    def __init__(self, impl):
        self._impl = impl

    @classmethod
    def from_pretrained(cls, path, dtype="float32", threads=0):
        """Loads config.json and model.safetensors (or its shards) from the directory `path`.
        threads: the backend's worker threads (0: one per core)."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no such model directory: {path!r}")
        return cls(_tightfit._load_model(path, _dtype_name(dtype), threads))

    @property
    def config(self):
        """The model's configuration (the fields of config.json tightfit reads)."""
        return self._impl.config

    @property
    def dtype(self):
        return self._impl.dtype

    def state_dict(self):
        """Copies of the weights, by Hugging Face name."""
        return self._impl._state_dict()

    def gradients(self, input_ids, labels=None, position_ids=None, objective="sft",
                  schedule="stream", chunk=None, **objective_options):
        """The loss and every parameter's gradient on one batch: (loss, {name: array}).

        schedule: "stream" (StreamBP), "checkpoint" or "full"; chunk: positions per chunk
        (default 512) or "auto" with budget= (bytes or "4G"). Options (the tool's names with _):
        attention_mask, lengths, head_chunk, temperature; grpo: advantages, old_logprobs,
        ref_logprobs, beta, epsilon_low, epsilon_high, loss_type, max_completion_length,
        importance_sampling_level, delta, mask_truncated_completions, eos_token_id; dpo (input_ids,
        labels, attention_mask, position_ids are the chosen sequences): rejected_input_ids,
        rejected_labels (default: rejected_input_ids), rejected_attention_mask,
        rejected_position_ids, ref_chosen_logps, ref_rejected_logps, beta, label_smoothing,
        rpo_alpha, simpo_gamma, loss_type.
        """
        arguments = dict(objective_options, input_ids=input_ids, position_ids=position_ids,
                         labels=input_ids if labels is None else labels, schedule=schedule,
                         chunk=chunk)
        if objective == "dpo" and arguments.get("rejected_labels") is None:
            arguments["rejected_labels"] = arguments.get("rejected_input_ids")
        arrays, options = _split(objective, arguments)
        return self._impl._gradients(objective, arrays, options)

    def logprobs(self, input_ids, labels=None, position_ids=None, attention_mask=None,
                 lengths=None, chunk=512, head_chunk=None, temperature=1.0, reduce=None):
        """Forward-only label log-probs (`tightfit logprobs`): a (B, T) array whose entry t is
        the log-prob of labels[t] (0 where nothing is predicted), or with reduce="sum" the sum
        per sequence (per document when packed)."""
        arrays, options = _split("sft", dict(
            input_ids=input_ids, labels=input_ids if labels is None else labels,
            position_ids=position_ids, attention_mask=attention_mask, lengths=lengths,
            chunk=chunk, head_chunk=head_chunk, temperature=temperature, reduce=reduce))
        return self._impl._logprobs(arrays, options)


def plan(model=None, *, preset=None, seq, budget, batch=1, dtype="float32", chunk=512,
         max_seq=1 << 22):
    """The memory planner (`tightfit plan`) for a Model, a model directory or a preset name:
    the largest power-of-two chunk whose StreamBP peak fits `budget` (bytes or "60G") at `seq`,
    and the largest sequence length of each schedule (activation bytes)."""
    if isinstance(model, Model):
        model = model._impl
    elif model is not None:
        model = os.fspath(model)
    options = dict(seq=seq, budget=budget, batch=batch, dtype=_dtype_name(dtype), chunk=chunk,
                   max_seq=max_seq)
    return _tightfit._plan(model, preset or "", options)


def presets():
    """The preset names plan() accepts."""
    return list(_tightfit._presets())
