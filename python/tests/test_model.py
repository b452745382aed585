"""tightfit.Model and tightfit.plan against `tightfit grad`, `logprobs` and `plan` on the same
checkpoint and batch (double precision: to 1e-12), the inputs read from numpy and torch, the
errors, the GIL released and Ctrl-C."""
import json
import os
import re
import signal
import threading
import time

import numpy as np
import pytest

import tightfit
from helpers import LLAMA, load_safetensors, save_safetensors, tool, worst_relative, write_model

TOL = 1e-12
B, T = 3, 11
LENGTHS = [11, 7, 9]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    write_model(d)
    return d


@pytest.fixture(scope="module")
def model(model_dir):
    return tightfit.Model.from_pretrained(model_dir, dtype="float64")


def make_rows(g, rows, lengths):
    """ids, labels (a 3-token prompt ignored; padding keeps token labels), attention_mask."""
    ids = g.integers(0, LLAMA["vocab_size"], (rows, T))
    labels = ids.copy()
    labels[:, :3] = -100
    mask = np.zeros((rows, T), dtype=np.int64)
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
    return ids, labels, mask


@pytest.fixture(scope="module")
def batch():
    g = np.random.default_rng(7)
    ids, labels, mask = make_rows(g, B, LENGTHS)
    lp = -np.abs(g.normal(2, 0.5, (B, T)))
    lp[:, 0] = 0
    return dict(input_ids=ids, labels=labels, attention_mask=mask,
                advantages=g.normal(0, 1, B), old_logprobs=lp,
                ref_logprobs=lp + g.normal(0, 0.1, (B, T)))


def tool_grad(model_dir, tmp_path, tensors, *options):
    """loss and gradients of `tightfit grad` on a batch file holding `tensors`."""
    save_safetensors(tmp_path / "batch.safetensors", tensors)
    out = tmp_path / "grads.safetensors"
    run = tool("grad", "--model", model_dir, "--batch", tmp_path / "batch.safetensors",
               "--out", out, *options)
    return json.loads(run.stdout)["loss"], load_safetensors(out)


def assert_close(loss, grads, ref_loss, ref_grads, tol=TOL):
    assert abs(loss - ref_loss) <= tol * abs(ref_loss), (loss, ref_loss)
    assert worst_relative(grads, ref_grads) <= tol


@pytest.mark.parametrize("schedule, chunk", [("stream", 4), ("checkpoint", 512), ("full", 512)])
def test_sft_gradients_equal_the_tool(model, model_dir, batch, tmp_path, schedule, chunk):
    keys = ["input_ids", "labels", "attention_mask"]
    ref = tool_grad(model_dir, tmp_path, {k: batch[k] for k in keys}, "--dtype", "f64",
                    "--sched", schedule, "--chunk", chunk)
    loss, grads = model.gradients(batch["input_ids"], batch["labels"], schedule=schedule,
                                  chunk=chunk, attention_mask=batch["attention_mask"])
    assert all(g.dtype == np.float64 for g in grads.values())
    assert_close(loss, grads, *ref)
    # the same call again: gradients do not accumulate across calls
    assert_close(*model.gradients(batch["input_ids"], batch["labels"], schedule=schedule,
                                  chunk=chunk, attention_mask=batch["attention_mask"]), *ref)


def test_grpo_gradients_equal_the_tool(model, model_dir, batch, tmp_path):
    ref = tool_grad(model_dir, tmp_path, batch, "--dtype", "f64", "--objective", "grpo",
                    "--chunk", "4", "--beta", "0.04", "--loss-type", "dapo", "--epsilon-high",
                    "0.28", "--mask-truncated-completions", "--eos-token-id", "5,7")
    loss, grads = model.gradients(objective="grpo", chunk=4, beta=0.04, loss_type="dapo",
                                  epsilon_high=0.28, mask_truncated_completions=True,
                                  eos_token_id=[5, 7], **batch)
    assert_close(loss, grads, *ref)


def test_dpo_gradients_equal_the_tool(model, model_dir, tmp_path):
    g = np.random.default_rng(11)
    ci, cl, cm = make_rows(g, 2, [11, 8])
    ri, rl, rm = make_rows(g, 2, [9, 11])
    refs = dict(ref_chosen_logps=g.normal(-20, 2, 2), ref_rejected_logps=g.normal(-22, 2, 2))
    ref = tool_grad(model_dir, tmp_path, dict(
        chosen_input_ids=ci, chosen_labels=cl, chosen_attention_mask=cm, rejected_input_ids=ri,
        rejected_labels=rl, rejected_attention_mask=rm, **refs), "--dtype", "f64", "--objective",
        "dpo", "--beta", "0.2", "--rpo-alpha", "0.5")
    loss, grads = model.gradients(ci, cl, attention_mask=cm, rejected_input_ids=ri,
                                  rejected_labels=rl, rejected_attention_mask=rm,
                                  objective="dpo", beta=0.2, rpo_alpha=0.5, **refs)
    assert_close(loss, grads, *ref)


def test_packed_gradients_and_torch_inputs(model, model_dir, tmp_path):
    """Packed documents (position_ids), and the same batch as torch tensors (DLPack)."""
    g = np.random.default_rng(5)
    ids = g.integers(0, LLAMA["vocab_size"], (2, T))
    pos = np.array([list(range(4)) + list(range(7)), list(range(T))])
    ref = tool_grad(model_dir, tmp_path, dict(input_ids=ids, labels=ids, position_ids=pos),
                    "--dtype", "f64", "--chunk", "3")
    assert_close(*model.gradients(ids, position_ids=pos, chunk=3), *ref)
    torch = pytest.importorskip("torch")
    assert_close(*model.gradients(torch.from_numpy(ids), position_ids=torch.from_numpy(pos),
                                  chunk=3), *ref)
    # int32 ids, strided (a column slice) and 1-D (one row) inputs are read as the same batch
    wide = np.zeros((2, 2 * T), dtype=np.int32)
    wide[:, ::2] = ids
    assert_close(*model.gradients(wide[:, ::2], position_ids=pos, chunk=3), *ref)
    one = tool_grad(model_dir, tmp_path, dict(input_ids=ids[:1], labels=ids[:1]), "--dtype",
                    "f64")
    assert_close(*model.gradients(list(ids[0])), *one)


def test_float32_gradients_equal_the_tool(model_dir, batch, tmp_path):
    keys = ["input_ids", "labels", "attention_mask"]
    ref = tool_grad(model_dir, tmp_path, {k: batch[k] for k in keys}, "--dtype", "f32",
                    "--chunk", "5")
    m32 = tightfit.Model.from_pretrained(model_dir, dtype=np.float32, threads=1)
    assert m32.dtype == "float32"
    loss, grads = m32.gradients(batch["input_ids"], batch["labels"], chunk=5,
                                attention_mask=batch["attention_mask"])
    assert all(v.dtype == np.float32 for v in grads.values())
    assert_close(loss, grads, *ref, tol=1e-5)


def test_logprobs_equal_the_tool(model, model_dir, batch, tmp_path):
    tensors = {k: batch[k] for k in ["input_ids", "labels", "attention_mask"]}
    save_safetensors(tmp_path / "b.safetensors", tensors)
    tool("logprobs", "--model", model_dir, "--batch", tmp_path / "b.safetensors", "--out",
         tmp_path / "lp.safetensors", "--dtype", "f64", "--objective", "grpo", "--chunk", "4")
    ref = load_safetensors(tmp_path / "lp.safetensors")["ref_logprobs"]
    lp = model.logprobs(batch["input_ids"], batch["labels"], chunk=4,
                        attention_mask=batch["attention_mask"])
    assert lp.shape == (B, T)
    assert np.abs(lp - ref).max() <= TOL * np.abs(ref).max()
    # per-sequence sums, as `tightfit logprobs --objective dpo` writes the reference sums
    dpo = dict(chosen_input_ids=batch["input_ids"][:2], chosen_labels=batch["labels"][:2],
               rejected_input_ids=batch["input_ids"][1:], rejected_labels=batch["labels"][1:])
    save_safetensors(tmp_path / "p.safetensors", dpo)
    tool("logprobs", "--model", model_dir, "--batch", tmp_path / "p.safetensors", "--out",
         tmp_path / "ps.safetensors", "--dtype", "f64")
    sums = load_safetensors(tmp_path / "ps.safetensors")
    chosen = model.logprobs(batch["input_ids"][:2], batch["labels"][:2], reduce="sum")
    rejected = model.logprobs(batch["input_ids"][1:], batch["labels"][1:], reduce="sum")
    np.testing.assert_allclose(chosen, sums["ref_chosen_logps"], rtol=TOL)
    np.testing.assert_allclose(rejected, sums["ref_rejected_logps"], rtol=TOL)


def parse_plan(text):
    chunk = re.search(r"chunk at T=\d+: (\d+)", text)
    full, ckpt, stream, stream_chunk = re.search(
        r"largest T: full (\d+), checkpoint (\d+), stream (\d+) \(chunk (\d+)\)", text).groups()
    return dict(chunk=int(chunk.group(1)) if chunk else 0, max_seq_full=int(full),
                max_seq_checkpoint=int(ckpt), max_seq_stream=int(stream),
                stream_chunk=int(stream_chunk))


def test_plan_equals_the_tool(model, model_dir):
    for kwargs, args in [
        (dict(preset="qwen3-4b", seq=32768, budget="60G"),
         ["--preset", "qwen3-4b", "--seq", "32768", "--budget", "60G"]),
        (dict(model=model, seq=4096, budget=1 << 24, batch=2, dtype="float64"),
         ["--model", model_dir, "--seq", "4096", "--budget", str(1 << 24), "--batch", "2",
          "--dtype", "f64"]),
        (dict(model=model_dir, seq=2048, budget="8M"),
         ["--model", model_dir, "--seq", "2048", "--budget", "8M"]),
    ]:
        p = tightfit.plan(**kwargs)
        ref = parse_plan(tool("plan", *args).stdout)
        assert {k: p[k] for k in ref} == ref
    assert "qwen3-4b" in tightfit.presets()


def test_plan_refuses_more_than_2_62_tokens():
    # the tool's `plan` refuses the same (its closed form prices B x T tokens as an index)
    with pytest.raises(ValueError, match=r"seq 4611686018427387904 x batch 2 is more than 2\^62"):
        tightfit.plan(preset="qwen3-4b", seq=1 << 62, batch=2, budget="60G")
    with pytest.raises(ValueError, match=r"max_seq 4194304 x batch 2199023255552 is more than 2\^62"):
        tightfit.plan(preset="qwen3-4b", seq=1, batch=1 << 41, budget="60G")


@pytest.mark.parametrize("change, message", [
    (dict(input_ids=np.full((B, T), 99)), r"input_ids\[0\]\[0\] is 99, outside the vocabulary"),
    (dict(input_ids=np.zeros((B, T)) + 0.5), "input_ids has dtype float64, expected integers"),
    (dict(labels=np.zeros((B, T - 1), dtype=np.int64)), r"labels is \(3, 10\), expected \(3, 11\)"),
    (dict(attention_mask=np.full((B, T), 2)), r"attention_mask\[0\]\[0\] is 2, expected 0 or 1"),
    (dict(objective="grpo", advantages=np.array([0.1, np.nan, 0.3])),
     r"advantages holds nan at flat index 1"),
    (dict(objective="grpo"), "the batch has no tensor 'advantages'"),
    (dict(objective="ppo"), "objective is 'ppo', expected 'sft', 'grpo' or 'dpo'"),
    (dict(schedule="fast"), "unknown schedule 'fast'"),
    (dict(chunk=0), r"chunk is 0, outside \[1, "),
    (dict(chunk="big"), "chunk is 'big', expected an integer or 'auto'"),
    (dict(budget="4G"), "budget applies to chunk='auto' only"),
    (dict(temperature=0.0), r"temperature is 0, outside \[1e-06, "),
    (dict(beta=0.1), "beta is not an option of objective='sft'"),
    (dict(objective="grpo", epsilon_low=1.0), r"epsilon_low is 1, expected in \[0, 1\)"),
    (dict(objective="dpo", beta=0.0), "beta is 0, expected > 0 for objective='dpo'"),
    (dict(temprature=1.0), "temprature is not an option of objective='sft'"),
])
def test_bad_input_is_refused(model, batch, change, message):
    args = dict(input_ids=batch["input_ids"], labels=batch["labels"],
                attention_mask=batch["attention_mask"])
    args.update(change)
    with pytest.raises(ValueError, match=message):
        model.gradients(**args)


def test_bad_models_are_refused(tmp_path, model_dir):
    with pytest.raises(FileNotFoundError):
        tightfit.Model.from_pretrained(tmp_path / "nothing")
    with pytest.raises(ValueError, match="dtype is 'int8', expected 'float32' or 'float64'"):
        tightfit.Model.from_pretrained(model_dir, dtype="int8")
    bad = tmp_path / "bad"
    weights = write_model(bad)
    weights["model.norm.weight"][3] = np.nan
    save_safetensors(bad / "model.safetensors", weights)
    with pytest.raises(ValueError, match=r"tensor 'model.norm.weight' holds nan at index 3"):
        tightfit.Model.from_pretrained(bad)
    cfg = dict(LLAMA, hidden_act="relu")
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="hidden_act"):
        tightfit.Model.from_pretrained(bad)


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory):
    """A model whose gradients on a long batch take a while (interruption, GIL)."""
    d = tmp_path_factory.mktemp("deep")
    write_model(d, dict(LLAMA, num_hidden_layers=24, hidden_size=64, intermediate_size=128,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16))
    return tightfit.Model.from_pretrained(d, dtype="float64")


def test_ctrl_c_stops_a_long_call(slow_model):
    """SIGINT during gradients() raises KeyboardInterrupt between layers, long before the call
    would have ended; the model then computes as before."""
    ids = np.arange(4 * 1024).reshape(4, 1024) % LLAMA["vocab_size"]
    small = ids[:1, :32]
    before = slow_model.gradients(small)
    start = time.perf_counter()
    slow_model.gradients(ids[:, :256], chunk=64)
    quarter = time.perf_counter() - start  # a quarter of the tokens, a quarter of the layers' work
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    start = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        slow_model.gradients(ids, chunk=64)
    stopped = time.perf_counter() - start
    timer.join()
    assert stopped < 2 * quarter + 0.5, (stopped, quarter)
    assert_close(*slow_model.gradients(small), *before)


def test_the_gil_is_released_while_computing(slow_model):
    ids = np.arange(2 * 512).reshape(2, 512) % LLAMA["vocab_size"]
    ticks = []
    done = threading.Event()

    def count():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    start = time.perf_counter()
    slow_model.gradients(ids, chunk=64)
    end = time.perf_counter()
    done.set()
    counter.join()
    during = [t for t in ticks if start < t < end]
    assert len(during) >= 10, (len(during), end - start)
