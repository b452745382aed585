"""The parameters of a Llama / Mistral / Qwen2 / Qwen3 checkpoint by Hugging Face name, in the
layout transformers uses, drawn by the caller's mat(*shape) and norm(n) in a fixed order (the
cross-checks draw torch tensors, python/tests numpy arrays)."""


def hf_parameters(cfg, mat, norm):
    """{name: tensor} for config.json's dict `cfg`; biases and q/k norms as transformers puts
    them: Qwen2 has q/k/v biases always and no o_proj bias, Llama / Qwen3 biases on q/k/v/o when
    attention_bias is true, Llama's mlp_bias, Qwen3's q_norm / k_norm."""
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    h, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", d // h)  # Qwen2 configs do not give head_dim
    arch = cfg["architectures"][0]
    qk_norm = arch == "Qwen3ForCausalLM"
    qkv_bias = arch == "Qwen2ForCausalLM" or cfg.get("attention_bias", False)
    o_bias = arch != "Qwen2ForCausalLM" and cfg.get("attention_bias", False)
    mlp_bias = arch == "LlamaForCausalLM" and cfg.get("mlp_bias", False)
    p = {"model.embed_tokens.weight": mat(v, d)}
    for l in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        p[pre + "input_layernorm.weight"] = norm(d)
        p[pre + "self_attn.q_proj.weight"] = mat(h * hd, d)
        p[pre + "self_attn.k_proj.weight"] = mat(hkv * hd, d)
        p[pre + "self_attn.v_proj.weight"] = mat(hkv * hd, d)
        p[pre + "self_attn.o_proj.weight"] = mat(d, h * hd)
        if qkv_bias:
            p[pre + "self_attn.q_proj.bias"] = mat(h * hd)
            p[pre + "self_attn.k_proj.bias"] = mat(hkv * hd)
            p[pre + "self_attn.v_proj.bias"] = mat(hkv * hd)
        if o_bias:
            p[pre + "self_attn.o_proj.bias"] = mat(d)
        if qk_norm:
            p[pre + "self_attn.q_norm.weight"] = norm(hd)
            p[pre + "self_attn.k_norm.weight"] = norm(hd)
        p[pre + "post_attention_layernorm.weight"] = norm(d)
        p[pre + "mlp.gate_proj.weight"] = mat(f, d)
        p[pre + "mlp.up_proj.weight"] = mat(f, d)
        p[pre + "mlp.down_proj.weight"] = mat(d, f)
        if mlp_bias:
            p[pre + "mlp.gate_proj.bias"] = mat(f)
            p[pre + "mlp.up_proj.bias"] = mat(f)
            p[pre + "mlp.down_proj.bias"] = mat(d)
    p["model.norm.weight"] = norm(d)
    if not cfg["tie_word_embeddings"]:
        p["lm_head.weight"] = mat(v, d)
    return p
