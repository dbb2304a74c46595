"""``python -m attnbook.audit --transformers``: the padding audit of every text architecture in transformers'
causal-LM and masked-LM auto mappings, each built from a tiny config with random weights (chapter 10, "Padding bugs
in the wild", section on the sweep).

For each entry of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` and ``MODEL_FOR_MASKED_LM_MAPPING_NAMES`` (a model type and
its class), :func:`tiny_config` shrinks the type's default config by attribute name (width 32, 2 layers, 4 heads,
vocabulary 128, ...; :data:`SHRINK`, then :data:`OVERRIDES` per model type), builds the class with random weights
(offline: no download), and :func:`attnbook.audit.hf.audit_hf` audits it under the conditions of
:data:`CONDITIONS`: right padding; left padding without ``position_ids`` and with them counted from the mask; the
model cast to fp16 and to bf16 (right padding). Every condition's audit includes the empty row (``empty_row``).

Each entry runs in a forked process under a time limit (``--timeout``) and a ``try``; an entry that cannot be built small, or whose
model cannot run on token ids alone (one that needs images or audio), is listed with the reason. Finished entries go
to a partial file beside ``--out`` as they finish, so an interrupted sweep resumes where it stopped; the CSV (one row
per entry, condition, check and mode), the Markdown summary and the JSON provenance record are written atomically at
the end, and the partial file removed.

Needs transformers (the book's extra); the sweep is a command, not part of the book's build.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import signal
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from attnbook.provenance import atomic_write_text, provenance, write_provenance

__all__ = ["CONDITIONS", "SHRINK", "OVERRIDES", "Entry", "entries", "tiny_config", "build", "audit_entry",
           "audit_isolated", "direct_check", "classify", "summary", "cause_counts", "triage", "records_from_table",
           "reclassify", "headline", "triage_sentence", "main", "LENGTHS", "MODES", "CAUSES", "NOTES", "FLAGGED",
           "REPORTS", "READINGS",
           "FP32_CONDITIONS", "HALF_CONDITIONS"]

DEFAULT_OUT = Path("results/audit_transformers.csv")
#: Row lengths of the audited batch (padded to 12; ``extra_padding`` pads to 24).
LENGTHS = (7, 3, 12, 1)
#: Grad mode of every audit in the sweep (transformers' models take no fast path that depends on it).
MODES = ("no_grad",)
WIDTH, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, POSITIONS, WINDOW = 32, 2, 4, 2, 8, 64, 128, 128, 8

#: The audited conditions: name -> (padding side, position_ids, dtype).
CONDITIONS: dict[str, tuple[str, str, torch.dtype]] = {
    "right": ("right", "none", torch.float32),
    "left": ("left", "none", torch.float32),
    "left_positions": ("left", "from_mask", torch.float32),
    "fp16": ("right", "none", torch.float16),
    "bf16": ("right", "none", torch.bfloat16),
}

#: Config attributes shrunk by name, to the value given (or by the function, from the default value).
SHRINK: dict[str, Any] = {
    **dict.fromkeys(["hidden_size", "n_embd", "d_model", "dim", "embed_dim", "model_dim", "n_embed", "d_embed"],
                    WIDTH),
    **dict.fromkeys(["embedding_size", "word_embed_proj_dim", "attention_hidden_size"], WIDTH),
    **dict.fromkeys(["num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
                     "num_decoder_layers", "num_encoder_layers"], LAYERS),
    **dict.fromkeys(["num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "num_decoder_attention_heads"], HEADS),
    **dict.fromkeys(["head_dim", "d_kv", "attention_head_dim", "kv_channels", "d_head", "qk_head_dim"], HEAD_DIM),
    **dict.fromkeys(["qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"], HEAD_DIM),
    **dict.fromkeys(["kv_lora_rank", "q_lora_rank"], 16),
    **dict.fromkeys(["intermediate_size", "n_inner", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff",
                     "ffn_hidden_size", "d_inner", "dim_feedforward", "ffn_embed_dim", "inner_dim"], FFN),
    **dict.fromkeys(["moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size",
                     "moe_ffn_hidden_size", "shared_intermediate_size"], 16),
    **dict.fromkeys(["num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts", "num_experts_total"],
                    4),
    **dict.fromkeys(["num_experts_per_tok", "moe_topk", "top_k", "moe_k", "num_selected_experts"], 2),
    **dict.fromkeys(["max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_sequence_length",
                     "seq_length"], POSITIONS),
    **dict.fromkeys(["mamba_d_state", "state_size", "ssm_state_size", "mamba_chunk_size"], 16),
    **dict.fromkeys(["mamba_n_heads", "mamba_num_heads"], 8),
    **dict.fromkeys(["mamba_d_head", "mamba_head_dim"], 8),
    **dict.fromkeys(["mamba_d_ssm"], 64),
    "vocab_size": VOCAB,
}


def _kv(value: Any, original: dict) -> Any:
    heads = next((original[k] for k in ("num_attention_heads", "n_head", "num_heads") if k in original), None)
    if value is None or not isinstance(value, int):
        return value
    return HEADS if value == heads else (1 if value == 1 else KV_HEADS)


#: Attributes shrunk by a function of (default value, the whole default config).
SHRINK_BY: dict[str, Any] = {
    **dict.fromkeys(["num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num",
                     "n_head_kv", "num_kv"], _kv),
    **dict.fromkeys(["sliding_window", "attention_window_size", "window_size"],
                    lambda v, _: min(v, WINDOW) if isinstance(v, int) and v > 0 else v),
    **dict.fromkeys(["n_group", "topk_group"], lambda v, _: 1 if isinstance(v, int) else v),
    **dict.fromkeys(["rotary_dim"], lambda v, _: min(v, HEAD_DIM) if isinstance(v, int) else v),
    **dict.fromkeys(["first_k_dense_replace"], lambda v, _: min(v, 1) if isinstance(v, int) else v),
}

#: Per model type, attributes set after :data:`SHRINK` (values that the generic rules get wrong).
OVERRIDES: dict[str, dict[str, Any]] = {
    "mamba2": {"num_heads": 4, "head_dim": 16, "n_groups": 1, "state_size": 16, "chunk_size": 16},
    "mamba": {"state_size": 16, "time_step_rank": 8},
    "falcon_mamba": {"state_size": 16, "time_step_rank": 8},
    "reformer": {"axial_pos_shape": [8, 16], "axial_pos_embds_dim": [16, 16], "attention_head_size": 8,
                 "feed_forward_size": 64, "local_attn_chunk_length": 8, "lsh_attn_chunk_length": 8,
                 "attn_layers": ["local", "local"], "num_buckets": 4, "max_position_embeddings": 128},
    "funnel": {"block_sizes": [1, 1], "block_repeats": [1, 1], "d_head": 8, "n_head": 4},
    "longformer": {"attention_window": [4, 4]},
    "big_bird": {"attention_type": "original_full"},
    "perceiver": {"num_latents": 8, "d_latents": 32, "num_self_attends_per_block": 1, "num_blocks": 1,
                  "num_self_attention_heads": 4, "num_cross_attention_heads": 1, "qk_channels": 32,
                  "v_channels": 32},
    "xlstm": {"num_heads": 2, "qk_dim_factor": 0.5, "v_dim_factor": 1.0, "chunk_size": 8},
}


@dataclass(frozen=True)
class Entry:
    """One entry of an auto mapping: ``mapping`` ("causal-lm" or "masked-lm"), the model type and the class name."""

    mapping: str
    model_type: str
    class_name: str

    @property
    def key(self) -> str:
        return f"{self.mapping}:{self.model_type}"


def _transformers():
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    return transformers


def entries() -> list[Entry]:
    """Every entry of transformers' causal-LM and masked-LM auto mappings, in the mappings' order."""
    _transformers()
    from transformers.models.auto import modeling_auto as auto

    return ([Entry("causal-lm", t, c) for t, c in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()]
            + [Entry("masked-lm", t, c) for t, c in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES.items()])


def _shrink(d: dict) -> dict:
    original = dict(d)
    for key, value in list(d.items()):
        if isinstance(value, dict) and key.endswith("_config"):
            d[key] = _shrink(dict(value))
        elif key in SHRINK and isinstance(value, int) and not isinstance(value, bool):
            d[key] = min(value, SHRINK[key]) if key not in ("vocab_size",) else SHRINK[key]
        elif key in SHRINK_BY:
            d[key] = SHRINK_BY[key](value, original)
        elif ("dropout" in key or "pdrop" in key or key.endswith("drop_rate")) and isinstance(value, float):
            d[key] = 0.0
    layers = next((d[k] for k in ("num_hidden_layers", "n_layer", "num_layers") if isinstance(d.get(k), int)),
                  LAYERS)
    depth = next((original[k] for k in ("num_hidden_layers", "n_layer", "num_layers") if k in original), None)
    for key, value in list(d.items()):  # per-layer lists (layer_types, ...): one layer of each kind, in order
        if isinstance(value, list) and depth and len(value) == depth and all(isinstance(v, str) for v in value):
            kinds = list(dict.fromkeys(value))[:layers]
            d[key] = (kinds + [v for v in value if v not in kinds] + value)[:layers] if len(kinds) < layers \
                else kinds
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "sep_token_id",
                "cls_token_id", "mask_token_id", "unk_token_id"):
        value = d.get(key)
        if isinstance(value, int) and value >= VOCAB:
            d[key] = VOCAB - 1 - ("eos" in key)
        elif isinstance(value, list):
            d[key] = [v if v < VOCAB else VOCAB - 2 for v in value if isinstance(v, int)] or None
    return d


def tiny_config(entry: Entry):
    """The entry's default config, shrunk (:data:`SHRINK`, :data:`SHRINK_BY`, :data:`OVERRIDES`); a causal-LM entry
    of a type that also has a masked-LM entry (BERT-like) is built as a decoder (``is_decoder=True``)."""
    tf = _transformers()
    from transformers.models.auto import modeling_auto as auto

    config_class = tf.CONFIG_MAPPING[entry.model_type]
    d = _shrink(config_class().to_dict())
    d.update(OVERRIDES.get(entry.model_type, {}))
    if entry.mapping == "causal-lm" and entry.model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        d["is_decoder"] = True
    for key in ("transformers_version", "architectures", "_name_or_path", "model_type"):
        d.pop(key, None)
    return config_class.from_dict(d)


def build(entry: Entry, seed: int = 0) -> torch.nn.Module:
    """The entry's class from :func:`tiny_config`, with random weights (seeded), in eval mode."""
    tf = _transformers()
    config = tiny_config(entry)
    cls = getattr(tf, entry.class_name)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls(config)
    return model.eval()


class Timeout(Exception):
    """An entry ran past its time limit."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def stop(signum, frame):
        raise Timeout(f"ran past the time limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)  # fires again each second, should code catch it
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _reason(error: BaseException) -> str:
    message = " ".join(str(error).split()) or type(error).__name__
    if len(message) > 200:
        message = message[:197] + "..."
    return f"{type(error).__name__}: {message}"


def _size(model: torch.nn.Module) -> dict[str, Any]:
    c = model.config
    get = lambda *names: next((getattr(c, n) for n in names if isinstance(getattr(c, n, None), int)), None)  # noqa
    return {"width": get("hidden_size", "n_embd", "d_model", "dim"),
            "layers": get("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
            "heads": get("num_attention_heads", "n_head", "num_heads", "n_heads"),
            "attn_implementation": str(getattr(c, "_attn_implementation", None)),
            "parameters": sum(p.numel() for p in model.parameters())}


def audit_entry(entry: Entry, conditions: tuple[str, ...] = tuple(CONDITIONS), timeout: float = 60.0,
                lengths: tuple[int, ...] = LENGTHS, modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    """Build ``entry`` small and audit it under each condition; never raises (except KeyboardInterrupt).

    Returns:
        ``{"entry", "mapping", "model_type", "class", "status", "reason", "seconds", "size", "rows"}``: ``status``
        is ``"audited"`` or ``"not built"`` (``reason`` then says why: the error, or the time limit); ``rows`` one
        dict per condition, check and mode (``condition``, ``kind``, ``position_ids``, ``dtype``, and the columns of
        :attr:`attnbook.audit.AuditReport.checks`). A condition whose audit raised (the forward failed on the plain
        padded batch) gets one row with check ``"forward"``, not passed, and the error as detail.
    """
    from .hf import audit_hf

    start = time.perf_counter()
    record: dict[str, Any] = {"entry": entry.key, "mapping": entry.mapping, "model_type": entry.model_type,
                              "class": entry.class_name, "status": "audited", "reason": "", "size": {}, "rows": []}
    try:
        with _time_limit(timeout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = build(entry)
            record["size"] = _size(model)
            audited = 0
            for name in conditions:
                side, positions, dtype = CONDITIONS[name]
                model.to(dtype)
                base = {"condition": name, "dtype": str(dtype).replace("torch.", "")}
                try:
                    report = audit_hf(model, padding_side=side, position_ids=positions, lengths=lengths,
                                      modes=modes, causal=False)
                except Timeout:
                    raise
                except Exception as error:  # noqa: BLE001 - listed with its reason
                    record["rows"].append({**base, "kind": "", "position_ids": positions, "check": "forward",
                                           "mode": modes[0], "passed": False, "max_abs_diff": math.nan,
                                           "max_rel_diff": math.nan, "detail": _reason(error)})
                    continue
                audited += 1
                base.update(kind=report.settings["kind"], position_ids=report.settings["position_ids"])
                record["rows"] += [{**base, **row} for row in report.checks.to_dict("records")]
            if not audited:
                first = record["rows"][0]["detail"] if record["rows"] else "no condition ran"
                record.update(status="not built", reason="the forward failed on token ids alone: " + first)
    except Timeout as error:
        record.update(status="not built", reason=str(error), rows=[])
    except Exception as error:  # noqa: BLE001 - listed with its reason
        record.update(status="not built", reason=_reason(error), rows=[])
    record["seconds"] = round(time.perf_counter() - start, 2)
    return record


def audit_isolated(entry: Entry, timeout: float = 60.0, **kwargs: Any) -> dict[str, Any]:
    """:func:`audit_entry` in a forked child process, killed after ``timeout`` seconds.

    A time limit inside the process (:func:`audit_entry`'s) cannot stop a single long torch operation; a child
    process can be stopped whatever it is doing. Where ``fork`` is not available, this is :func:`audit_entry`.

    Returns:
        The record of :func:`audit_entry`; when the child ran past ``timeout`` or died, a record with status
        ``"not built"`` and the reason.
    """
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        return audit_entry(entry, timeout=timeout, **kwargs)
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)

    def child() -> None:
        try:
            # a forked child inherits the parent's OpenMP thread pool without its threads: a parallel region with
            # more than one thread waits for them for ever (GNU libgomp is not fork-safe), so the child runs on one
            torch.set_num_threads(1)
            sender.send(audit_entry(entry, timeout=0, **kwargs))
        finally:
            sender.close()

    start = time.perf_counter()
    process = context.Process(target=child, daemon=True)
    process.start()
    sender.close()
    record = None
    if receiver.poll(timeout):
        with contextlib.suppress(EOFError):
            record = receiver.recv()
    process.join(1.0)
    if process.is_alive():
        process.kill()
        process.join()
    receiver.close()
    if record is None:
        reason = (f"ran past the time limit of {timeout:g} s" if time.perf_counter() - start >= timeout
                  else f"the process running it died (exit code {process.exitcode})")
        record = {"entry": entry.key, "mapping": entry.mapping, "model_type": entry.model_type,
                  "class": entry.class_name, "status": "not built", "reason": reason, "size": {}, "rows": [],
                  "seconds": round(time.perf_counter() - start, 2)}
    return record


# --- classification by root cause ---------------------------------------------------------------------------------

def _rows(record: dict, condition: str) -> pd.DataFrame:
    frame = pd.DataFrame(record["rows"])
    return frame[frame["condition"] == condition] if len(frame) else frame


def _state(rows: pd.DataFrame, checks: tuple[str, ...] | None = None) -> str:
    """``pass``, ``NaN`` (a non-finite output), ``differs``, ``error`` or ``-`` (not run) for a condition's rows.

    A condition whose forward raised has one row with check ``"forward"``: it is ``error`` whatever ``checks`` are.
    """
    if checks is not None and len(rows):
        rows = rows[rows["check"].isin((*checks, "forward"))]
    if not len(rows):
        return "-"
    if (rows["check"] == "forward").any():
        return "error"
    failed = rows[~rows["passed"].astype(bool)]
    if not len(failed):
        return "pass"
    detail = failed["detail"].fillna("").astype(str)
    if detail.str.contains("NaN or infinite").any():
        return "NaN"
    if detail.str.startswith("forward raised").any():
        return "error"
    return "differs"


PADDING_CHECKS = ("batch_equivalence", "extra_padding", "pad_content")
#: The conditions in fp32 (the padding itself) and in half precision (the model cast to fp16 or bf16).
FP32_CONDITIONS = ("right", "left", "left_positions")
HALF_CONDITIONS = ("fp16", "bf16")

#: The prefix of the causes that :func:`triage` reads: a failure in fp32 that only the model's documentation, its
#: design or a direct check can explain (not yet a bug: see :func:`triage`).
FLAGGED = "flagged: "
#: Every cause :func:`classify` gives, in reading order: ``cause -> (the chapter's words, whose side)``. The side is
#: ``"caller"`` (the caller's requirement), ``"design"`` (the model mixes positions by design),
#: ``"flagged, triaged below"`` (a failure in fp32 that :func:`triage` reads against the model's documentation, its
#: design and a direct check: only what none of them explains is a candidate upstream bug), ``"not audited"`` or
#: ``"none"``.
CAUSES: dict[str, tuple[str, str]] = {
    "none": ("passed every check in all five conditions", "none"),
    "positions count the pads (pass position_ids)":
        ("absolute positions count the pads unless position_ids are passed", "caller"),
    "reads the pad ids": ("other ids in the pads change real outputs (passes when the pads hold the pad id)",
                          "caller"),
    "positions cannot follow left padding":
        ("absolute positions and no position_ids argument: pad on the right", "caller"),
    "pads reach real tokens under left padding":
        ("no position_ids, and the pads' ids change real outputs under left padding: pad on the right", "caller"),
    "half precision: within its rounding":
        ("passes in fp32; in fp16 or bf16 differs by less than that dtype's tolerance, but fails the tolerance of "
         "the output's dtype", "the audit's tolerance"),
    "half precision: fails": ("passes in fp32; in fp16 or bf16 differs beyond that dtype's tolerance, gives NaN or "
                              "raises", "half precision"),
    "flagged: left padding with position_ids":
        ("differs under left padding even with position_ids from the mask", "flagged, triaged below"),
    "flagged: right padding": ("differs or gives NaN under right padding in fp32",
                                              "flagged, triaged below"),
    "forward raised an error": ("the forward raised in some or all conditions: not audited there", "not audited"),
}


def classify(record: dict) -> dict[str, Any]:
    """One row of the summary: each condition's state (padding checks; the empty row apart), and one root cause.

    ``cause`` (the keys of :data:`CAUSES`) is the first that applies of: ``"not built"``; ``"forward raised an
    error"`` (right padding in fp32 raised: the entry was not audited there); ``"reads the pad ids"`` (in fp32 only
    ``pad_content`` fails, under right padding and under left padding with position ids: other ids in the pads move
    real outputs, the pad id does not); ``"flagged: right padding"`` (right padding gives NaN or
    differs in fp32, beyond pad content alone, whatever the other conditions did); ``"forward raised an error"``
    (another condition in fp32 raised); ``"flagged: left padding with position_ids"`` (left padding still differs when
    the model takes position ids counted from the mask); ``"reads the pad ids"`` (under left padding without position
    ids only ``pad_content`` fails: positions counted from the pad id, as RoBERTa's); ``"pads reach real tokens under
    left padding"`` (no position_ids, left padding differs and ``pad_content`` fails too: the pads' ids, not only
    their number, reach real tokens); ``"positions cannot follow left padding"`` (the model takes no position_ids,
    and left padding differs); ``"positions count the pads (pass position_ids)"`` (left padding differs without
    position ids and passes with them); ``"half precision: within its rounding"`` (every fp32 condition passes; fp16
    or bf16 fails, but every failing difference is finite and within the default tolerance of that dtype, so only
    the tolerance of the output's dtype failed it: a model that returns fp32 logits is judged at fp32's);
    ``"half precision: fails"`` (every fp32 condition passes; fp16 or bf16 fails otherwise); ``"none"``: every
    condition ran and every check passed, the empty row included. An entry that fits none of them is
    ``"unclassified"`` (never counted as a pass).

    ``half`` says whether fp16 and bf16 passed every check (``"pass"``) or lists the ones that did not, whatever the
    cause; ``failed`` lists each condition's failing checks (``"right: pad_content; fp16: forward"``).
    """
    if record["status"] != "audited":
        return {"entry": record["entry"], "model_type": record["model_type"], "mapping": record["mapping"],
                "class": record["class"], "cause": "not built", "reason": record["reason"]}
    state = {name: _state(_rows(record, name), PADDING_CHECKS) for name in CONDITIONS}
    empty = {name: _state(_rows(record, name), ("empty_row",)) for name in CONDITIONS}
    every = {name: _state(_rows(record, name)) for name in CONDITIONS}
    positions = next((r["position_ids"] for r in record["rows"] if r["condition"] == "left_positions"), "")
    failed = {name: set(_failed_checks(record, name)) for name in CONDITIONS}
    bad = ("NaN", "differs")
    half_bad = [name for name in HALF_CONDITIONS if every[name] != "pass"]
    if state["right"] == "error":
        cause = "forward raised an error"
    elif failed["right"] == {"pad_content"} and failed["left_positions"] <= {"pad_content"} \
            and positions == "from_mask":
        cause = "reads the pad ids"
    elif state["right"] in bad:
        cause = "flagged: right padding"   # whatever the other conditions did: right padding is the default
    elif any(state[name] == "error" for name in FP32_CONDITIONS):
        cause = "forward raised an error"
    elif state["left_positions"] in bad and positions == "from_mask":
        cause = "flagged: left padding with position_ids"
    elif failed["left"] == {"pad_content"}:
        cause = "reads the pad ids"
    elif state["left"] in bad and positions == "not taken" and "pad_content" in failed["left"]:
        cause = "pads reach real tokens under left padding"
    elif state["left"] in bad and positions == "not taken":
        cause = "positions cannot follow left padding"
    elif state["left"] in bad and state["left_positions"] == "pass":
        cause = "positions count the pads (pass position_ids)"
    elif any(every[name] == "-" for name in CONDITIONS):
        cause = "unclassified"  # a condition did not run: never a pass
    elif all(every[name] == "pass" for name in FP32_CONDITIONS) and half_bad:
        within = all(_within_dtype(record, name) for name in half_bad)
        cause = "half precision: within its rounding" if within else "half precision: fails"
    elif all(every[name] == "pass" for name in CONDITIONS):
        cause = "none"
    else:
        cause = "unclassified"
    kind = next((r["kind"] for r in record["rows"] if r.get("kind")), "")
    listed = "; ".join(f"{name}: {', '.join(sorted(failed[name]))}" for name in CONDITIONS if failed[name])
    return {"entry": record["entry"], "model_type": record["model_type"], "mapping": record["mapping"],
            "class": record["class"], "kind": kind, "position_ids": positions,
            **{name: state[name] for name in CONDITIONS}, "empty_row": empty["right"],
            "empty_row_fp16": empty["fp16"], "half": "pass" if not half_bad else ", ".join(half_bad),
            "failed": listed, "cause": cause, "reason": ""}


def _within_dtype(record: dict, condition: str) -> bool:
    """Whether every failing row of ``condition`` is finite and within the default tolerance of the condition's
    dtype (:func:`attnbook.audit.checks.default_tolerance`, relative to the largest output): a failure that only the
    tolerance of another output dtype sees (a model cast to fp16 that returns fp32 logits is judged at fp32's)."""
    from .checks import default_tolerance

    rows = _rows(record, condition)
    failed = rows[~rows["passed"].astype(bool)]
    if not len(failed) or (failed["check"] == "forward").any():
        return False
    diffs = pd.to_numeric(failed["max_rel_diff"], errors="coerce")
    return bool(diffs.notna().all() and (diffs <= default_tolerance(CONDITIONS[condition][2])).all())


def _failed_checks(record: dict, condition: str) -> list[str]:
    rows = _rows(record, condition)
    if not len(rows):
        return []
    return list(dict.fromkeys(rows.loc[~rows["passed"].astype(bool), "check"]))


def summary(records: list[dict]) -> pd.DataFrame:
    """One row per entry (:func:`classify`)."""
    return pd.DataFrame([classify(r) for r in records])


#: How :func:`cause_counts` splits the flagged entries by what :func:`triage` read, in this order (the first whose
#: key the reading contains): ``key -> (the chapter's words, whose side)``. A reading whose direct check raised
#: comes first: a model page that describes a design confirms nothing without a check that ran.
READINGS: dict[str, tuple[str, str]] = {
    "confirms nothing": ("flagged; the direct check raised, so nothing is confirmed (its model page describes a "
                         "design that could explain it)", "unconfirmed"),
    "own mask": ("flagged; builds its own mask from the token ids, for left padding (read in its source, not "
                 "documented)", "design"),
    "documented": ("flagged; takes no attention mask, as documented: one fixed length", "caller"),
    "by design": ("flagged; mixes positions outside masked attention, by design", "design"),
    "not reproduced": ("flagged; not reproduced by a direct check", "not reproduced"),
    "unexplained": ("flagged; neither documentation nor design explains it: a candidate upstream bug", "library"),
}


def _reading_key(reading: str) -> str:
    return next((key for key in READINGS if key in reading), "unexplained")


def cause_counts(table: pd.DataFrame, triaged: pd.DataFrame | None = None) -> pd.DataFrame:
    """The audited entries by cause, each cause once, in :data:`CAUSES` order: ``cause`` (the chapter's words),
    ``side``, ``entries`` and ``model types``; then one row, ``"of these, failed in fp16 or bf16"``, that counts the
    entries whose half-precision conditions failed, whatever their cause (so the rows above it add up to the audited
    entries, and this one overlaps them). With ``triaged`` (:func:`triage`), the flagged entries are counted by what
    the triage read (:data:`READINGS`) rather than by their flag, so every row is a root cause, not a symptom.

    Raises:
        ValueError: a cause that :data:`CAUSES` does not know (``"unclassified"`` included), so that no entry is
            dropped or counted as a pass unseen; or a flagged entry that ``triaged`` lacks.
    """
    audited = table[table["cause"] != "not built"]
    unknown = sorted(set(audited["cause"]) - set(CAUSES))
    if unknown:
        raise ValueError(f"entries with causes that CAUSES does not know: {unknown}")
    flagged = audited[audited["cause"].astype(str).str.startswith(FLAGGED)]
    reading = {}
    if triaged is not None:
        reading = dict(zip(triaged["entry"], triaged["reading"].astype(str)))
        missing = sorted(set(flagged["entry"]) - set(reading))
        if missing:
            raise ValueError(f"flagged entries without a triage reading: {missing}")
    rows = []
    for cause, (words, side) in CAUSES.items():
        sel = audited[audited["cause"] == cause]
        if not len(sel):
            continue
        if cause.startswith(FLAGGED) and triaged is not None:
            continue   # counted by reading below, where the first flagged cause stood
        rows.append({"cause": words, "side": side, "entries": len(sel), "model types": sel["model_type"].nunique()})
    if triaged is not None and len(flagged):
        at = next((i for i, r in enumerate(rows) if r["cause"] == CAUSES["forward raised an error"][0]), len(rows))
        keys = flagged["entry"].map(lambda e: _reading_key(reading[e]))
        split = [{"cause": READINGS[k][0], "side": READINGS[k][1], "entries": int((keys == k).sum()),
                  "model types": flagged.loc[keys == k, "model_type"].nunique()} for k in READINGS if (keys == k).any()]
        rows[at:at] = split
    half = audited[audited["half"] != "pass"]
    rows.append({"cause": "of these, failed in fp16 or bf16 (any cause)", "side": "",
                 "entries": len(half), "model types": half["model_type"].nunique()})
    return pd.DataFrame(rows, columns=["cause", "side", "entries", "model types"])


#: What a candidate's documentation asks of the caller, or what its design does that mixes positions outside masked
#: attention, keyed by model type: ``(reading, label, url, basis)``; ``basis`` says what the reading rests on (the
#: documentation, a model page, an upstream test's reason for a skip, or the source code alone).
NOTES: dict[str, tuple[str, str, str, str]] = {
    "deepseek_v4": ("pools windows of tokens before the mask, so left padding folds pads into its pooled key-value "
                    "entries: by design, as a skipped upstream test says", "transformers#45938",
                    "https://github.com/huggingface/transformers/issues/45938", "an upstream test's skip reason"),
    "cpmant": ("builds its own mask from input_ids != 0, for left padding (its attention_mask is a dummy "
               "parameter): pad on the left with id 0", "CPM-Ant's forward (source)",
               "https://github.com/huggingface/transformers/blob/main/src/transformers/models/cpmant/"
               "modeling_cpmant.py", "the source code only"),
    "fnet": ("takes no attention mask: documented (use one fixed length, pads included)", "FNet's usage tips",
             "https://huggingface.co/docs/transformers/model_doc/fnet", "documentation"),
    "nystromformer": ("approximate attention by design (landmarks averaged over segments)",
                      "Nyströmformer's model page", "https://huggingface.co/docs/transformers/model_doc/nystromformer",
                      "model page"),
    "yoso": ("approximate attention by design (hashing)", "YOSO's model page",
             "https://huggingface.co/docs/transformers/model_doc/yoso", "model page"),
    "reformer": ("chunked attention by design", "Reformer's model page",
                 "https://huggingface.co/docs/transformers/model_doc/reformer", "model page"),
    "convbert": ("a convolution over the sequence by design", "ConvBERT's model page",
                 "https://huggingface.co/docs/transformers/model_doc/convbert", "model page"),
}
#: Upstream reports of the same failure that do not explain it (an entry stays unexplained, and the report is
#: cited), keyed by model type: ``(label, url)``. The label says whether the thread is open or closed.
REPORTS: dict[str, tuple[str, str]] = {
    "prophetnet": ("transformers#24289 (closed)", "https://github.com/huggingface/transformers/issues/24289"),
}
#: A direct difference at or below this (relative to the largest output) does not reproduce a failure.
DIRECT_TOLERANCE = 1e-5


def triage(table: pd.DataFrame, long: pd.DataFrame, direct: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """The flagged entries of the sweep, triaged: one row per entry whose cause starts with :data:`FLAGGED`.

    Args:
        table: :func:`summary` (columns ``entry``, ``model_type``, ``cause``, ``failed``).
        long: :func:`long_table` (the CSV), for the audit's largest relative difference.
        direct: entry -> :func:`direct_check` (``right``, ``left``: a float or an error's name;
            ``attention_mask``, ``position_ids``: whether the forward takes them).

    Returns:
        ``entry``, ``failing checks`` (fp32 conditions), ``side`` (``right`` or ``left``, the failing condition the
        direct check repeats), ``audit`` (the largest relative difference there), ``direct`` (the direct check's on
        that side), ``attention_mask in signature``, ``position_ids in signature`` (whether the forward has the
        argument, not whether it uses it: CPM-Ant's is a dummy), ``reading`` (documented, by design, not
        reproduced directly, or unexplained), ``basis`` (what the reading rests on: documentation, a model page,
        an upstream test's skip reason, the source code only, or the direct check; with "(the direct check
        raised)" where it could not run), ``described in`` (a Markdown link, or ``"none cited"``) and
        ``unexplained`` (bool: reproduced directly and neither documented nor by design).

    Raises:
        KeyError: a candidate without a direct check.
    """
    sel = table[table["cause"].astype(str).str.startswith(FLAGGED)]
    rows = []
    for r in sel.itertuples(index=False):
        side = "right" if r.cause.endswith("right padding") else "left"
        condition = "right" if side == "right" else "left_positions"
        failing = long[(long["entry"] == r.entry) & (long["condition"] == condition)
                       & ~long["passed"].astype(bool)]
        audit_diff = failing["max_rel_diff"].max()
        check = direct[r.entry]
        value = check[side]
        reproduced = not isinstance(value, str) and value > DIRECT_TOLERANCE
        reading, label, url, basis = NOTES.get(r.model_type, ("", "", "", ""))
        if reading and isinstance(value, str):
            reading += f" (the direct check raised {value}, so it confirms nothing)"
            basis += " (the direct check raised)"
        if not reading:
            reading = ("unexplained: a candidate upstream bug" if reproduced else
                       f"not reproduced directly ({'the direct call raised' if isinstance(value, str) else 'passes'})")
            basis = "the direct check"
            if r.model_type in REPORTS:
                label, url = REPORTS[r.model_type]
                reading += ", reported upstream"
                basis += "; a matching upstream report"
        fp32 = "; ".join(part for part in str(r.failed).split("; ") if part.split(":")[0] in FP32_CONDITIONS)
        rows.append({"entry": r.entry, "failing checks": fp32, "side": side,
                     "audit": "NaN" if pd.isna(audit_diff) else f"{audit_diff:.1e}",
                     "direct": value if isinstance(value, str) else f"{value:.1e}",
                     "attention_mask in signature": "yes" if check.get("attention_mask") else "no",
                     "position_ids in signature": "yes" if check.get("position_ids") else "no",
                     "reading": reading, "basis": basis,
                     "described in": f"[{label}]({url})" if url else "none cited",
                     "unexplained": bool(reproduced and r.model_type not in NOTES)})
    columns = ["entry", "failing checks", "side", "audit", "direct", "attention_mask in signature",
               "position_ids in signature", "reading", "basis", "described in", "unexplained"]
    return pd.DataFrame(rows, columns=columns)


def headline(table: pd.DataFrame, triaged: pd.DataFrame) -> str:
    """The sweep's verdict in one clause, from :func:`triage`: how many audited entries differ in a way that
    neither the model's documentation nor its design explains, and that a direct check with the model reproduces
    (the triage table names them). Ends with a full stop.

    Raises:
        ValueError: no entry was audited.
    """
    n = int((table["cause"] != "not built").sum())
    if n == 0:
        raise ValueError("no entry of the sweep was audited")
    k = int(triaged["unexplained"].astype(bool).sum()) if len(triaged) else 0
    if k == 0:
        return (f"none of the {n} audited entries differs in a way that neither the documentation nor the design "
                f"explains.")
    flags = triaged["unexplained"].astype(bool) & triaged["reading"].astype(str).str.contains("reported upstream")
    reported = int(flags.sum())
    labels = triaged["described in"] if "described in" in triaged else pd.Series("", index=triaged.index)
    closed = int((flags & labels.astype(str).str.contains("(closed)", regex=False)).sum())
    if reported == 0:
        told = ""
    elif reported == k:
        told = (", matching an earlier upstream report that is now closed" if closed == k == 1 else
                f", matching earlier upstream reports ({closed} of them now closed)" if closed else
                ", matching an earlier upstream report" if k == 1 else ", matching earlier upstream reports")
    else:
        told = f", {reported} of them reported upstream"
    return (f"{k} of the {n} audited entries {'differs' if k == 1 else 'differ'} in a way that neither the "
            f"documentation nor the design explains, and a direct check reproduces {'it' if k == 1 else 'each'}: "
            f"{'a candidate upstream bug' if k == 1 else 'candidate upstream bugs'}{told}.")


#: How :func:`triage_sentence` words each reading of :data:`READINGS`, in the sentence's order:
#: ``key -> (verb for one, verb for several, what)``.
_TRIAGE_WORDS = {
    "by design": ("mixes", "mix", "positions outside masked attention by design"),
    "own mask": ("builds", "build", "its own mask from the token ids, for left padding"),
    "documented": ("is", "are", "documented as taking no attention mask"),
    "confirms nothing": ("is", "are", "unconfirmed (its direct check raised)"),
    "not reproduced": ("is", "are", "not reproduced by the direct check"),
    "unexplained": ("remains", "remain", "unexplained"),
}


def triage_sentence(triaged: pd.DataFrame) -> str:
    """How :func:`triage` read the flagged entries, in one sentence (``""`` when none was flagged). Each entry is
    counted by the same reading as in :func:`cause_counts` (:data:`READINGS`), so the sentence and the table agree.
    """
    if triaged.empty:
        return ""
    keys = triaged["reading"].astype(str).map(_reading_key)
    parts = []
    for key, (one, many, what) in _TRIAGE_WORDS.items():
        k = int((keys == key).sum())
        if k:
            parts.append(f"{k} {one if k == 1 else many} {what}")
    body = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    n = len(triaged)
    return f"Of the {n} {'entry' if n == 1 else 'entries'} the audit flagged, {body}."


def records_from_table(long: pd.DataFrame) -> list[dict]:
    """The records of :func:`audit_entry` rebuilt from the CSV (:func:`long_table`), in its order, so that a sweep
    can be classified again without running it (``--reclassify``)."""
    records = []
    columns = ["condition", "kind", "position_ids", "dtype", "check", "mode", "passed", "max_abs_diff",
               "max_rel_diff", "detail"]
    for entry, group in long.groupby("entry", sort=False):
        first = group.iloc[0]
        record = {"entry": entry, "mapping": first["mapping"], "model_type": first["model_type"],
                  "class": first["class"], "status": first["status"],
                  "reason": "" if pd.isna(first["reason"]) else str(first["reason"]), "rows": []}
        if record["status"] == "audited":
            rows = group[columns].copy()
            rows["passed"] = rows["passed"].astype(str).str.lower().eq("true")
            for name in ("kind", "position_ids", "dtype", "check", "mode", "detail", "condition"):
                rows[name] = rows[name].fillna("").astype(str)
            record["rows"] = rows.to_dict("records")
        records.append(record)
    return records


def long_table(records: list[dict]) -> pd.DataFrame:
    """One row per entry, condition, check and mode (the CSV)."""
    rows = []
    for r in records:
        if r["status"] != "audited":
            rows.append({"entry": r["entry"], "mapping": r["mapping"], "model_type": r["model_type"],
                         "class": r["class"], "status": r["status"], "reason": r["reason"]})
            continue
        for row in r["rows"]:
            rows.append({"entry": r["entry"], "mapping": r["mapping"], "model_type": r["model_type"],
                         "class": r["class"], "status": r["status"], "reason": "", **row})
    columns = ["entry", "mapping", "model_type", "class", "status", "reason", "condition", "kind", "position_ids",
               "dtype", "check", "mode", "passed", "max_abs_diff", "max_rel_diff", "detail"]
    return pd.DataFrame(rows).reindex(columns=columns)


def markdown(table: pd.DataFrame, record: dict, triaged: pd.DataFrame | None = None) -> str:
    """The Markdown page of a sweep: versions, counts by root cause, the table, and what could not be built."""
    audited = table[table["cause"] != "not built"]
    lines = [
        "# Padding audit of transformers' architectures",
        "",
        "Written by `python -m attnbook.audit --transformers` (chapter 10, \"Padding bugs in the wild\"). Every "
        "entry of transformers' causal-LM and masked-LM auto mappings, built from its default config shrunk to "
        f"width {WIDTH}, {LAYERS} layers and {HEADS} heads with random weights (no download), audited with "
        "`attnbook.audit.hf.audit_hf` on random token ids (row lengths " + " ".join(map(str, LENGTHS))
        + f", modes {', '.join(MODES)}, default tolerances). Conditions: right padding; left padding without "
        "`position_ids` and with them counted from the mask; right padding in fp16 and in bf16. A cell is `pass`, "
        "`differs`, `NaN` or `error` for the padding checks (batch equivalence, extra padding, pad content); the "
        "empty row has its own column.",
        "",
        f"Versions: transformers {record['libraries']['transformers']}, torch {record['torch']}, python "
        f"{record['python']}. {len(audited)} of {len(table)} mapping entries audited; wall time "
        f"{record['wall_time_s']:.0f} s on {record['device']}.",
        "",
        "## Entries by root cause",
        "",
        table["cause"].value_counts().rename_axis("cause").reset_index(name="entries").to_markdown(index=False),
        "",
        "An entry counts as `none` only if every condition ran and every check passed, the empty row included; "
        "the column `half` lists the half-precision conditions that failed, whatever the cause.",
        "",
    ]
    if triaged is not None and len(triaged):
        lines += ["## Candidates, triaged", "",
                  "Each candidate's failing checks in fp32, the audit's largest relative difference beside a direct "
                  f"check with the model (one sequence of 7 tokens padded to 12; a difference at or below "
                  f"{DIRECT_TOLERANCE:g} does not reproduce the failure), and a reading.", "",
                  triaged.to_markdown(index=False), ""]
    lines += [
        "## Audited entries",
        "",
        audited.drop(columns=["reason"]).to_markdown(index=False),
        "",
        "## Entries not built small",
        "",
    ]
    skipped = table[table["cause"] == "not built"]
    lines += [f"- `{r.entry}` ({r._4}): {r.reason}" for r in skipped.itertuples()] or ["None."]
    lines += ["", "## Provenance", ""]
    lines += [f"- {k}: {v}" for k, v in record.items() if k not in ("config", "libraries", "not_built")]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m attnbook.audit --transformers",
        description="Audit the padding behaviour of every text architecture in transformers' causal-LM and "
                    "masked-LM auto mappings, each built from a tiny config with random weights (offline).")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="the CSV to write; the .md and .json go beside it (default: %(default)s)")
    parser.add_argument("--only", default="", help="comma-separated model types (default: every entry)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per entry (default: %(default)s)")
    parser.add_argument("--list", action="store_true", help="list the mapping entries and exit")
    parser.add_argument("--reclassify", action="store_true",
                        help="classify the sweep in --out again (and check its candidates directly) without "
                             "running it: rewrites the .md and the .json's summary, causes and triage")
    args = parser.parse_args(argv)
    if args.out.suffix != ".csv":
        parser.error(f"--out must end in .csv, got {str(args.out)!r}")
    return args


def _triage_flagged(table: pd.DataFrame, long: pd.DataFrame, known: list[Entry]) -> pd.DataFrame:
    """The flagged entries of ``table``, each checked directly with its model (:func:`direct_check`) and read
    (:func:`triage`): what a whole run and ``--reclassify`` both store."""
    by_key = {e.key: e for e in known}
    flagged = table[table["cause"].astype(str).str.startswith(FLAGGED)]
    return triage(table, long, {key: direct_check(by_key[key]) for key in flagged["entry"]})


def reclassify(out: Path) -> pd.DataFrame:
    """Classify the sweep stored in ``out`` (the CSV, with its .json beside it) again, check its candidates directly
    (:func:`direct_check`, :func:`triage`), and rewrite the .md and the .json's ``summary``, ``causes`` and
    ``triage`` (the run's provenance is kept). Returns the summary."""
    long = pd.read_csv(out)
    records = records_from_table(long)
    table = summary(records)
    record = json.loads(out.with_suffix(".json").read_text())
    triaged = _triage_flagged(table, long, entries())
    for name in ("summary", "causes", "triage"):
        record.pop(name, None)
    record["causes"] = table["cause"].value_counts().to_dict()
    atomic_write_text(out.with_suffix(".md"), markdown(table, record, triaged))
    write_provenance(out.with_suffix(".json"), {**record, "summary": table.to_dict("records"),
                                                "triage": triaged.to_dict("records")})
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reclassify:
        table = reclassify(args.out)
        print(table["cause"].value_counts().to_string())
        return 0
    selected = entries()
    if args.only:
        wanted = {t.strip() for t in args.only.split(",") if t.strip()}
        unknown = wanted - {e.model_type for e in selected}
        if unknown:
            print(f"unknown model types: {sorted(unknown)}", file=sys.stderr)
            return 2
        selected = [e for e in selected if e.model_type in wanted]
    if args.list:
        for e in selected:
            print(f"{e.mapping:10s} {e.model_type:30s} {e.class_name}")
        return 0
    torch.set_num_threads(1)
    partial = args.out.with_suffix(".partial.jsonl")
    done: dict[str, dict] = {}
    if partial.exists():
        for line in partial.read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                done[record["entry"]] = record
    start = time.perf_counter()
    previous = sum(r.get("seconds", 0.0) for r in done.values() if r["entry"] in {e.key for e in selected})
    partial.parent.mkdir(parents=True, exist_ok=True)
    if any(e.key not in done for e in selected):
        # warm up once in this process, so that each forked child starts with torch's and transformers' lazy
        # initialization done (without it every child repeats it: about 3 s per entry instead of 0.3 s)
        audit_entry(Entry("causal-lm", "gpt2", "GPT2LMHeadModel"), conditions=("right",), timeout=args.timeout)
    with partial.open("a") as sink:
        for k, entry in enumerate(selected, 1):
            if entry.key in done:
                continue
            record = audit_isolated(entry, timeout=args.timeout)
            done[entry.key] = record
            sink.write(json.dumps(record, default=str) + "\n")
            sink.flush()
            print(f"[{k}/{len(selected)}] {entry.key}: {record['status']} {record['seconds']:.1f} s "
                  f"{record['reason'][:80]}", flush=True)
    records = [done[e.key] for e in selected]
    wall = time.perf_counter() - start + previous
    table = summary(records)
    import transformers

    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    config = {"lengths": list(LENGTHS), "modes": list(MODES), "conditions": list(CONDITIONS), "width": WIDTH,
              "layers": LAYERS, "heads": HEADS, "vocab_size": VOCAB, "timeout_s": args.timeout,
              "entries": [e.key for e in selected]}
    audited = int((table["cause"] != "not built").sum())
    record = provenance(wall_time_s=wall, device="cpu", mode="full", threads=1, libraries=versions, config=config,
                        n_entries=len(selected), n_audited=audited,
                        n_model_types=len({e.model_type for e in selected}),
                        n_audited_model_types=int(table.loc[table["cause"] != "not built", "model_type"].nunique()),
                        causes=table["cause"].value_counts().to_dict(),
                        command="python -m attnbook.audit --transformers "
                                + " ".join(sys.argv[1:] if argv is None else argv))
    long = long_table(records)
    buffer = io.StringIO()
    long.to_csv(buffer, index=False, float_format="%.4g")
    atomic_write_text(args.out, buffer.getvalue())
    triaged = _triage_flagged(table, long, selected)
    atomic_write_text(args.out.with_suffix(".md"), markdown(table, record, triaged))
    write_provenance(args.out.with_suffix(".json"), {**record, "summary": table.to_dict("records"),
                                                     "triage": triaged.to_dict("records")})
    partial.unlink(missing_ok=True)
    print(table["cause"].value_counts().to_string())
    print(f"\n{audited} of {len(selected)} entries audited; {wall:.0f} s. Wrote {args.out} and its .md and .json.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def direct_check(entry: Entry, n: int = 7, length: int = 12, seed: int = 1) -> dict[str, float | str | bool]:
    """The entry's padding difference computed directly with the model, outside the audit: one sequence of ``n``
    random tokens, alone and padded to ``length`` on each side (with position ids from the mask when the model takes
    them), compared on its real positions.

    Returns:
        ``{"right": r, "left": l, "attention_mask": a, "position_ids": p}``: the largest ``|padded - alone|`` over
        the largest ``|alone|`` of the outputs (logits or last hidden state), or the error's type name when the
        model raised; whether the model's forward takes ``attention_mask`` and ``position_ids``.
    """
    from .hf import _output, _takes, positions_from_mask

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build(entry)
        pad = getattr(model.config, "pad_token_id", None) or 0
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, VOCAB - 1, (1, n), generator=generator)
        ids = ids + (ids >= pad).long()
        extra = {}
        if getattr(model.config, "is_encoder_decoder", False):
            extra["decoder_input_ids"] = torch.tensor([[pad, 5, 7]])
        takes = _takes(model, "position_ids")
        result: dict[str, float | str | bool] = {"attention_mask": _takes(model, "attention_mask"),
                                                 "position_ids": takes}
        for side in ("right", "left"):
            where = slice(0, n) if side == "right" else slice(length - n, length)
            padded = torch.full((1, length), pad)
            mask = torch.zeros(1, length, dtype=torch.long)
            padded[0, where], mask[0, where] = ids[0], 1
            ones = torch.ones_like(ids)
            try:
                with torch.no_grad():
                    alone = _output(model(input_ids=ids, attention_mask=ones, **extra,
                                          **({"position_ids": positions_from_mask(ones)} if takes else {})))
                    out = _output(model(input_ids=padded, attention_mask=mask, **extra,
                                        **({"position_ids": positions_from_mask(mask)} if takes else {})))
            except Exception as error:  # noqa: BLE001 - reported as the error's name
                result[side] = type(error).__name__
                continue
            token = not extra
            a, b = (alone[0], out[0, where]) if token else (alone[0], out[0])
            result[side] = float((a - b).abs().max() / a.abs().max().clamp_min(1e-30))
    return result
