"""verl's own ``RLHFDataset`` reads the files back as the agent loop will receive them.

Skipped where verl (``sandlot[train]``) is not installed; CI installs it, and fails without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dataprep_support import EXAMPLES, run_prepare
from requirements import TRAIN, need_module

from sandlot.datasets.instance import Instance
from sandlot.datasets.loaders import load_instances
from sandlot.datasets.rows import TaskRow

rl_dataset = need_module("verl.utils.dataset.rl_dataset", TRAIN)


def _tokenizer() -> Any:
    """A word-level tokenizer with a chat template, built offline (no model download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1, "system": 2, "user": 3, "assistant": 4}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant{% endif %}"
    )
    return tokenizer


def test_rlhf_dataset_loads_rows_of_every_preprocessor(
    tmp_path: Path, mirror: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets
    from omegaconf import OmegaConf

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    files = [
        run_prepare("swe_bench_verified", tmp_path, "modal").path,
        run_prepare("swe_rebench", tmp_path, "vefaas").path,
        run_prepare("r2e_gym_subset", tmp_path, "docker").path,
        # Local rows carry other environment variables: the files must still concatenate.
        run_prepare(
            "swe_bench_verified",
            tmp_path,
            "local",
            input=EXAMPLES / "instances.jsonl",
            repo_mirror=str(mirror),
        ).path,
    ]
    config = OmegaConf.create(
        {
            "cache_dir": str(tmp_path / "verl-cache"),
            "prompt_key": "prompt",
            "max_prompt_length": 4096,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "return_raw_chat": True,
        }
    )
    dataset = rl_dataset.RLHFDataset([str(f) for f in files], _tokenizer(), config)
    expected: list[Instance] = [i for f in files for i in load_instances(f)]
    assert len(dataset) == len(expected) == 2 + 2 + 1 + 8

    for position, instance in enumerate(expected):
        item = dataset[position]
        # What AgentLoopWorker hands to the agent loop as keyword arguments.
        assert [m["role"] for m in item["raw_prompt"]] == ["system", "user"]
        assert instance.problem_statement in item["raw_prompt"][1]["content"]
        assert item["agent_name"] == "swe_agent"
        assert item["reward_model"] == {"style": "rule", "ground_truth": instance.instance_id}
        assert item["index"] == item["extra_info"]["index"]
        env = item["tools_kwargs"]["env"]
        assert env["image"] == instance.image and env["workdir"] == instance.workdir
        assert json.loads(env["env_variables"]) == instance.env
        reward = item["tools_kwargs"]["reward"]
        assert Instance.model_validate_json(reward["metadata"]) == instance
        # The whole row decodes back into the same instance.
        row = {k: item[k] for k in ("prompt", "data_source", "agent_name", "reward_model")}
        assert TaskRow.from_record({**row, "extra_info": item["extra_info"]}).instance == instance
